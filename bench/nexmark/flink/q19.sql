-- Nexmark q19 in Flink SQL: the ten highest bids of each auction.
-- tables: bid
-- sink: auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP(3), extra STRING, rank_number BIGINT
SELECT auction, bidder, price, channel, url, date_time, extra, rank_number
FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
  FROM bid
)
WHERE rank_number <= 10
