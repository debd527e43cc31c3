-- Nexmark q20 in Flink SQL: bids of auctions in category 10, with the auction's columns.
-- tables: bid, auction
-- sink: auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time_b TIMESTAMP(3), item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, date_time_a TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT
SELECT auction, bidder, price, channel, url, B.date_time AS date_time_b, item_name,
       description, initial_bid, reserve, A.date_time AS date_time_a, expires, seller, category
FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
WHERE A.category = 10
