-- V41: named API tokens (issue 37): `artex token create NAME --scope read|write|admin`.
-- Expand: a new table; nothing else changes.
--
-- A token's secret is shown once, when it is made, and never stored: the table holds its
-- SHA-256 (a secret is 32 random bytes, so a plain hash is as hard to reverse as the
-- secret is to guess). Every `artex serve` and worker reads the live tokens every two
-- seconds and matches a request's bearer token by its hash. A revoked token keeps its
-- row (who made it, who revoked it, when): the audit of who could do what. A name is
-- taken by one live token at a time; once revoked, it may be given again.

create table artex.api_tokens (
    id bigint generated always as identity primary key,
    name text not null check (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    scope text not null check (scope in ('read', 'write', 'admin')),
    secret_sha256 bytea not null unique check (octet_length(secret_sha256) = 32),
    created_by text not null,
    created_at timestamptz not null default now(),
    expires_at timestamptz check (expires_at > created_at),
    revoked_by text,
    revoked_at timestamptz,
    check ((revoked_at is null) = (revoked_by is null))
);
create unique index api_tokens_live_name on artex.api_tokens (name) where revoked_at is null;
comment on table artex.api_tokens is
    'Named bearer tokens of the HTTP API and the dashboard, by scope (read, write, admin), stored as the SHA-256 of their secret; revoked ones kept as their audit (migrations/V41).';
