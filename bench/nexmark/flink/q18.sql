-- Nexmark q18 in Flink SQL: each bidder's last bid on each auction.
-- tables: bid
-- sink: auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP(3), extra STRING
SELECT auction, bidder, price, channel, url, date_time, extra
FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number
  FROM bid
)
WHERE rank_number <= 1
