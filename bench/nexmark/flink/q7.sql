-- Nexmark q7 in Flink SQL: the highest bid of each 10-second window.
-- tables: bid
-- sink: auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP(3)
SELECT B.auction, B.price, B.bidder, B.date_time
FROM bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end AS date_time
  FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.date_time BETWEEN B1.date_time - INTERVAL '10' SECOND AND B1.date_time
