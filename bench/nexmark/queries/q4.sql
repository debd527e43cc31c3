-- Average price per category: the winning bid of each auction, averaged by category.
SELECT q.category, avg(q.final) AS avg
FROM (
  SELECT max(b.price) AS final, a.category
  FROM auction a JOIN bid b ON a.id = b.auction
  WHERE b.date_time BETWEEN a.date_time AND a.expires
  GROUP BY a.id, a.category
) q
GROUP BY q.category
