-- Expand bid with auction: bids on auctions in category 10, with the auction's columns.
SELECT auction, bidder, price, channel, url, b.date_time AS date_time_b, item_name,
       description, initial_bid, reserve, a.date_time AS date_time_a, expires, seller, category
FROM bid b JOIN auction a ON b.auction = a.id
WHERE a.category = 10
