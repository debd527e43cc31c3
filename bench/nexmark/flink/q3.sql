-- Nexmark q3 in Flink SQL: local item suggestion (auction joined with its seller).
-- tables: auction, person
-- sink: name STRING, city STRING, state STRING, id BIGINT
SELECT P.name, P.city, P.state, A.id
FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')
