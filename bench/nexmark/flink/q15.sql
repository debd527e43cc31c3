-- Nexmark q15 in Flink SQL: bidding statistics per day.
-- tables: bid
-- sink: `day` STRING, total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, rank3_bids BIGINT, total_bidders BIGINT, rank1_bidders BIGINT, rank2_bidders BIGINT, rank3_bidders BIGINT, total_auctions BIGINT, rank1_auctions BIGINT, rank2_auctions BIGINT, rank3_auctions BIGINT
SELECT
  DATE_FORMAT(date_time, 'yyyy-MM-dd') AS `day`,
  COUNT(*) AS total_bids,
  COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
  COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
  COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
  COUNT(DISTINCT bidder) AS total_bidders,
  COUNT(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
  COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
  COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
  COUNT(DISTINCT auction) AS total_auctions,
  COUNT(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
  COUNT(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
  COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions
FROM bid
GROUP BY DATE_FORMAT(date_time, 'yyyy-MM-dd')
