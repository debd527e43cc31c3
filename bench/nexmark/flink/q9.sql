-- Nexmark q9 in Flink SQL: the winning bid of each auction.
-- tables: auction, bid
-- sink: id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, auction BIGINT, bidder BIGINT, price BIGINT, bid_date_time TIMESTAMP(3)
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
       auction, bidder, price, bid_date_time
FROM (
  SELECT A.id, A.item_name, A.description, A.initial_bid, A.reserve, A.date_time, A.expires,
         A.seller, A.category, B.auction, B.bidder, B.price, B.date_time AS bid_date_time,
         ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rownum
  FROM auction A, bid B
  WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
)
WHERE rownum <= 1
