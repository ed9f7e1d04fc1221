-- Users are who the forge's numeric user id says, never a login: logins can be renamed and then
-- taken by someone else (see docs/decisions.md, "Identity by forge user id").

-- Web UI logins, one row per login: the signed cookie names its row, and a cookie whose row is
-- gone (logged out, expired) is refused, so a copied cookie stops working at logout.
CREATE TABLE web_sessions (
    id         TEXT PRIMARY KEY,           -- random, carried in the signed cookie
    forge      TEXT NOT NULL,              -- the [[forges]] name the user logged in with
    user_id    BIGINT NOT NULL CHECK (user_id > 0),
    login      TEXT NOT NULL,              -- the login at login time, for display only
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX web_sessions_expires_idx ON web_sessions (expires_at);

-- The [auth] admins entries ("forge:login") bound to the account that had the login when a
-- frontend first resolved the entry. The entry names that account as long as it keeps the
-- login: renamed, it is no longer admin (until the configuration names its new login), and
-- whoever takes the login later is not either.
CREATE TABLE admin_logins (
    forge     TEXT NOT NULL,
    login     TEXT NOT NULL,              -- lower-case
    user_id   BIGINT NOT NULL CHECK (user_id > 0),
    pinned_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (forge, login)
);

-- The pull request author's forge user id (the payload's user.id); NULL for evaluations
-- recorded before it was, whose authors then own nothing by authorship.
ALTER TABLE evaluations ADD COLUMN pr_author_id BIGINT;
