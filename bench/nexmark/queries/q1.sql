-- Currency conversion: each bid's price in euros.
SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid
