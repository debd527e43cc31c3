-- Find last bid: each bidder's last bid on each auction.
SELECT auction, bidder, price, channel, url, date_time, extra
FROM (
  SELECT *, row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number
  FROM bid
) t
WHERE rank_number <= 1
