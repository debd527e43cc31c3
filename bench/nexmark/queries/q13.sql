-- Bounded side input join: each bid with a value from a table of 10 000 rows.
SELECT b.auction, b.bidder, b.price, b.date_time, s.value
FROM bid b JOIN side_input s ON b.auction % 10000 = s.key
