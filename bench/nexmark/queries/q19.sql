-- Auction Top-N: the 10 highest bids of each auction.
SELECT auction, bidder, price, channel, url, date_time, extra, rank_number
FROM (
  SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
  FROM bid
) t
WHERE rank_number <= 10
