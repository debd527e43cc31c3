-- Log to file system: each bid with its day and minute (the sink is a blackhole here).
SELECT auction, bidder, price, date_time,
       to_char(date_time, 'YYYY-MM-DD') AS date, to_char(date_time, 'HH:MI') AS time
FROM bid
