-- Add channel id: from the channel's name, or from the url.
SELECT auction, bidder, price, channel,
       CASE
         WHEN lower(channel) = 'apple' THEN '0'
         WHEN lower(channel) = 'google' THEN '1'
         WHEN lower(channel) = 'facebook' THEN '2'
         WHEN lower(channel) = 'baidu' THEN '3'
         ELSE split_part(split_part(url, 'channel_id=', 2), '&', 1)
       END AS channel_id
FROM bid
WHERE split_part(split_part(url, 'channel_id=', 2), '&', 1) IS NOT NULL
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')
