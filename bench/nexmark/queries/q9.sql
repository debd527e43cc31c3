-- Winning bids: the highest (then earliest) valid bid of each auction.
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
       auction, bidder, price, bid_date_time
FROM (
  SELECT a.id, a.item_name, a.description, a.initial_bid, a.reserve, a.date_time, a.expires,
         a.seller, a.category, b.auction, b.bidder, b.price, b.date_time AS bid_date_time,
         row_number() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time ASC) AS rownum
  FROM auction a JOIN bid b ON a.id = b.auction
  WHERE b.date_time BETWEEN a.date_time AND a.expires
) t
WHERE rownum <= 1
