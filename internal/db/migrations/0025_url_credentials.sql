-- Credentials in the URLs of repositories added by URL before they were refused
-- (https://user:token@host/…): they move out of clone_url, full_name and evaluations.flake_url,
-- which every role reads and the pages show, into repository_credentials, which only the
-- frontend's login reads. Evaluations fetch them as they fetch a forge repository's read
-- credential: the evaluator asks a frontend with a signer's ticket for a held evaluation
-- (evalcred). A repository that had one is private from now on: its URL said it needs a
-- secret to read.
--
-- Over http(s) the whole user part is the credential (forges take a token as the user name);
-- over other schemes only the password is (an ssh user name is no secret).
CREATE TABLE repository_credentials (
    repo_id  BIGINT PRIMARY KEY REFERENCES repositories(id) ON DELETE CASCADE,
    username TEXT NOT NULL, -- percent-encoded, as it was in the URL
    password TEXT NOT NULL  -- percent-encoded; '' when the URL had a user name alone
);

WITH found AS (
    SELECT id, clone_url,
           lower(substring(clone_url FROM '^([A-Za-z][A-Za-z0-9+.-]*)://')) AS scheme,
           substring(clone_url FROM '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#@]*)@') AS userinfo
    FROM repositories
), credentialed AS (
    SELECT id, clone_url, scheme, userinfo,
           split_part(userinfo, ':', 1) AS username,
           CASE WHEN position(':' IN userinfo) > 0
                THEN substr(userinfo, position(':' IN userinfo) + 1) ELSE '' END AS password
    FROM found
    WHERE userinfo IS NOT NULL
      AND (position(':' IN userinfo) > 0 OR scheme IN ('http', 'https'))
), stored AS (
    INSERT INTO repository_credentials (repo_id, username, password)
    SELECT id, username, password FROM credentialed
    RETURNING repo_id
)
UPDATE repositories r SET
    clone_url = c.stripped,
    full_name = CASE WHEN r.full_name = c.clone_url THEN c.stripped ELSE r.full_name END,
    is_private = true
FROM (
    SELECT id, clone_url,
           CASE WHEN scheme IN ('http', 'https')
                THEN regexp_replace(clone_url, '^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@', '\1')
                ELSE regexp_replace(clone_url, '^([A-Za-z][A-Za-z0-9+.-]*://[^/?#@:]*):[^/?#@]*@', '\1@')
           END AS stripped
    FROM credentialed
) c
WHERE r.id = c.id AND r.id IN (SELECT repo_id FROM stored);

-- Evaluations keep the URL they evaluated for the record: without its credential.
UPDATE evaluations SET flake_url = regexp_replace(flake_url, '^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@', '\1')
WHERE flake_url ~ '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@'
   OR flake_url ~* '^([a-z+]*\+)?https?://[^/?#@]+@';
