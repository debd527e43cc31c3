-- Highest bid: the bids at the maximum price of their 10 s tumbling window.
SELECT b.auction, b.price, b.bidder, b.date_time
FROM bid b
JOIN (
  SELECT max(price) AS maxprice, window_end AS date_time
  FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND)
  GROUP BY window_end
) b1 ON b.price = b1.maxprice
WHERE b.date_time BETWEEN b1.date_time - INTERVAL '10' SECOND AND b1.date_time
