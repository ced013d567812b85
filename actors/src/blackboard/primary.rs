//! Following the primary across a failover. A database URL may name several hosts
//! (`postgresql://a:5432,b:5432/artex?target_session_attrs=read-write`); tokio-postgres
//! tries them in order and keeps the first that takes writes. What is ours: sharing one
//! log-in deadline among the hosts, closing connections that lead to a lost primary so
//! that the next checkout connects anew through that list, saying where a process writes
//! now, and masking passwords in URLs of either form.
//!
//! A connection to an old primary fails in one of three ways: the server is gone (the
//! socket closes, or the server says it shuts down), the host is cut off (silence: a
//! statement hangs until TCP gives up), or the server was demoted and answers every write
//! with SQLSTATE 25006 (read-only transaction). The first and the last are seen as errors
//! ([`noticed`], called for every PostgreSQL error the crate turns into its own; a server
//! found in recovery where the primary should be says so by [`lost`]); silence
//! is turned into an error by bounding unacknowledged data ([`share_deadlines`]). After one
//! such error every idle connection made before it is dropped at its next checkout
//! ([`drop_condemned`]): they lead to the same dead host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{ClientWrapper, Hook, HookError};
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;

use super::{Blackboard, DbLimits};
use crate::error::Result;

/// The earliest a host gets to connect and log in, whatever the number of hosts.
const MIN_HOST_DEADLINE: Duration = Duration::from_millis(500);

/// When a connection-level failure (or a demoted primary's refusal) was last seen in
/// this process: idle connections made before it are not handed out again.
static CONDEMNED_AT: Mutex<Option<Instant>> = Mutex::new(None);

/// The server each pool's URL (by its host list) last connected to, to log a move once.
static LAST_SERVER: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// With several hosts: each host gets its share of the log-in deadline, so that a silent
/// first host (cut off) leaves time for the next within the pool's create timeout; and
/// data left unacknowledged errs after the connect timeout rather than TCP's 30 s, so a
/// statement on a connection to a cut-off primary fails soon enough for the caller to
/// retry on the new one. With one host there is nowhere else to go, and nothing changes.
pub(super) fn share_deadlines(config: &mut tokio_postgres::Config, limits: &DbLimits) {
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    if hosts < 2 {
        return;
    }
    let share = (limits.connect_timeout / hosts as u32).max(MIN_HOST_DEADLINE);
    config
        .connect_timeout(share)
        .tcp_user_timeout(limits.connect_timeout);
}

/// Whether `e` says the connection's server is lost for writing: the connection closed or
/// failed below SQL (I/O, a timeout), the server shuts down or restarts, or it is a
/// demoted primary (read-only).
pub(crate) fn is_lost_primary(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => [
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
        ]
        .contains(code),
        // No SQLSTATE: the connection closed or its socket failed (a bad statement, a
        // value that does not convert, have no SQLSTATE either, and are not counted).
        None => {
            e.is_closed()
                || std::error::Error::source(e)
                    .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
        }
    }
}

/// Called for every PostgreSQL error the crate turns into its own: a lost primary
/// condemns the process's idle connections made until now.
pub(crate) fn noticed(e: &tokio_postgres::Error) {
    if is_lost_primary(e) {
        lost(&e.to_string());
    }
}

/// The primary is lost to a connection (`why`): the process's idle connections made
/// until now are dropped at their next checkout.
pub(crate) fn lost(why: &str) {
    condemn(Instant::now());
    tracing::debug!(%why, "the primary is lost to this connection; idle connections \
        made before now will be dropped");
}

fn condemn(at: Instant) {
    let mut last = CONDEMNED_AT.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t < at) {
        *last = Some(at);
    }
}

/// Whether a connection made at `created` was made before the last lost primary.
fn condemned(created: Instant) -> bool {
    let last = CONDEMNED_AT.lock().unwrap_or_else(|p| p.into_inner());
    last.is_some_and(|t| created <= t)
}

/// The pools' `pre_recycle` hook: an idle connection found closed condemns the others
/// made before it (the server it led to is gone); one made before a lost primary is
/// dropped, so the checkout connects anew through the URL's hosts.
pub(super) fn drop_condemned() -> Hook {
    Hook::sync_fn(|client: &mut ClientWrapper, metrics| {
        if client.is_closed() {
            condemn(Instant::now());
            return Err(HookError::message("the connection closed"));
        }
        if condemned(metrics.created) {
            return Err(HookError::message(
                "the connection was made before the primary was lost",
            ));
        }
        Ok(())
    })
}

/// The pools' `post_create` hook: asks the new connection
/// which server it reached and logs it when that is not where this URL's pools wrote
/// before, so an operator sees the move to a new primary in each process's log.
pub(super) fn note_server(config: &tokio_postgres::Config, deadline: Duration) -> Hook {
    let hosts = Arc::new(host_list(config));
    Hook::async_fn(move |client: &mut ClientWrapper, _| {
        let hosts = hosts.clone();
        Box::pin(async move {
            let server = match tokio::time::timeout(deadline, server_of(client)).await {
                Ok(Ok(server)) => server,
                Ok(Err(e)) => return Err(HookError::Backend(e)),
                Err(_) => {
                    return Err(HookError::message(format!(
                        "database: PostgreSQL did not say who it is within the connect \
                         timeout ({deadline:?})"
                    )))
                }
            };
            let mut last = LAST_SERVER.lock().unwrap_or_else(|p| p.into_inner());
            let before = last
                .get_or_insert_with(HashMap::new)
                .insert(hosts.to_string(), server.clone());
            match before {
                None => tracing::info!(database_host = %server, hosts = %hosts,
                    "blackboard: writing to {server}"),
                Some(old) if old != server => tracing::warn!(database_host = %server,
                    previous = %old, hosts = %hosts,
                    "blackboard: the primary moved; now writing to {server} (was {old})"),
                Some(_) => {}
            }
            Ok(())
        })
    })
}

/// `host:port` of the server `client` is connected to, as the server sees itself
/// (`local:<port>` over a Unix socket).
async fn server_of(client: &tokio_postgres::Client) -> Result<String, tokio_postgres::Error> {
    let rows = client
        .simple_query("select host(inet_server_addr()), current_setting('port')")
        .await?;
    let row = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
        _ => None,
    });
    let (addr, port) = match row {
        Some(r) => (r.get(0), r.get(1).unwrap_or("?")),
        None => (None, "?"),
    };
    Ok(match addr {
        Some(a) if a.contains(':') => format!("[{a}]:{port}"),
        Some(a) => format!("{a}:{port}"),
        None => format!("local:{port}"),
    })
}

impl Blackboard {
    /// `host:port` of the server this process's pool now writes to, as the server sees
    /// itself (`local:<port>` over a Unix socket): after a failover, the new primary.
    /// One round trip; `/health` shows it.
    pub async fn database_host(&self) -> Result<String> {
        let client = self.pool.get().await?;
        Ok(server_of(&client).await?)
    }
}

/// The server the pools of a URL naming `hosts` (see [`host_list`]) last connected to.
pub(super) fn last_server(hosts: &str) -> Option<String> {
    let last = LAST_SERVER.lock().unwrap_or_else(|p| p.into_inner());
    last.as_ref().and_then(|m| m.get(hosts).cloned())
}

/// The hosts (and ports) a config names, for logs: `a:5432,b:5433`.
pub(super) fn host_list(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| {
        ports
            .get(i)
            .or(ports.first())
            .copied()
            .unwrap_or(5432)
            .to_string()
    };
    let hosts: Vec<String> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{a}:{}", port(i)))
            .collect()
    } else {
        config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| match h {
                Host::Tcp(h) => format!("{h}:{}", port(i)),
                Host::Unix(p) => format!("{}:{}", p.display(), port(i)),
            })
            .collect()
    };
    hosts.join(",")
}

/// Whether every server `url` names is on another host: reached over TCP at an address
/// (or name) that is not loopback. A Unix socket, `localhost` or 127.0.0.0/8 / `::1` is
/// this host; a URL that does not parse is not judged (false).
pub fn is_remote(url: &str) -> bool {
    url.parse::<tokio_postgres::Config>()
        .is_ok_and(|config| config_is_remote(&config))
}

/// [`is_remote`] of a parsed URL.
pub(super) fn config_is_remote(config: &tokio_postgres::Config) -> bool {
    let hosts: Vec<bool> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .map(|a| !a.is_loopback())
            .collect()
    } else {
        config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(name) => !is_loopback_name(name),
                Host::Unix(_) => false,
            })
            .collect()
    };
    !hosts.is_empty() && hosts.into_iter().all(|remote| remote)
}

/// `localhost`, or a loopback IP address (brackets allowed around IPv6).
pub fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The URL with every password replaced by `***`, for logs and errors: the user info of
/// a `postgresql://` URL (before the `@` of its authority, whatever hosts follow) and a
/// `password=` query parameter, or a `password` pair of libpq's key=value form (quoted
/// or not, with spaces around `=` or not).
pub fn mask_password(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", mask_in_url(rest)),
        None => mask_key_value(url),
    }
}

/// `rest`: everything after `scheme://`.
fn mask_in_url(rest: &str) -> String {
    // The authority ends at the first '/', '?' or '#'; the user info at its last '@'.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((info, hosts)) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:***@{hosts}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some(("password", _)) => "password=***".to_string(),
                    _ => p.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{authority}{tail}")
}

/// libpq's `key = value …` form; values may be single-quoted with `\` escapes.
fn mask_key_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            out.push(c);
            chars.next();
            continue;
        }
        // A key, spaces, '=', spaces.
        let mut key_end = start;
        while let Some(&(i, c)) = chars.peek() {
            if c.is_whitespace() || c == '=' {
                break;
            }
            key_end = i + c.len_utf8();
            chars.next();
        }
        let key = &text[start..key_end];
        out.push_str(key);
        while let Some(&(_, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                out.push(c);
                chars.next();
                if c == '=' {
                    break;
                }
            } else {
                break;
            }
        }
        while let Some(&(_, c)) = chars.peek() {
            if !c.is_whitespace() {
                break;
            }
            out.push(c);
            chars.next();
        }
        // The value: quoted (to the closing quote) or up to the next space.
        let mut value = String::new();
        if let Some(&(_, '\'')) = chars.peek() {
            value.push('\'');
            chars.next();
            while let Some((_, c)) = chars.next() {
                value.push(c);
                if c == '\\' {
                    if let Some((_, e)) = chars.next() {
                        value.push(e);
                    }
                } else if c == '\'' {
                    break;
                }
            }
        } else {
            while let Some(&(_, c)) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        if key == "password" && !value.is_empty() {
            out.push_str("***");
        } else {
            out.push_str(&value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn a_database_is_remote_when_every_host_it_names_is_another_host() {
        assert!(is_remote("postgresql://u@10.0.0.5:5432/db"));
        assert!(is_remote("postgresql://u@db1,db2/db"));
        assert!(is_remote("host=10.1.2.3 dbname=x"));
        assert!(!is_remote("postgresql://u@127.0.0.1/db"));
        assert!(!is_remote("postgresql://u@localhost:5433/db"));
        assert!(!is_remote("postgresql://u@[::1]/db"));
        assert!(!is_remote("postgresql://u@db1,127.0.0.1/db"));
        assert!(!is_remote("host=/run/postgresql dbname=x"));
        assert!(!is_remote("not a url ://"));
        assert!(is_loopback_name("127.0.0.2") && is_loopback_name("[::1]"));
        assert!(!is_loopback_name("10.0.0.1") && !is_loopback_name("db"));
    }

    #[test]
    fn passwords_are_masked_in_urls_with_several_hosts() {
        let cases = [
            (
                "postgresql://artex:s3cret@a:5432,b:5433/artex?target_session_attrs=read-write",
                "postgresql://artex:***@a:5432,b:5433/artex?target_session_attrs=read-write",
            ),
            // An '@' in the query is not the user info's end.
            (
                "postgresql://a:5432,b:5432/artex?application_name=me@x&password=pw",
                "postgresql://a:5432,b:5432/artex?application_name=me@x&password=***",
            ),
            (
                "postgres://u@[::1]:5432,[::2]:5432/db",
                "postgres://u@[::1]:5432,[::2]:5432/db",
            ),
            (
                "host=a,b port=5432,5433 dbname=artex password=s3cret \
                 target_session_attrs=read-write",
                "host=a,b port=5432,5433 dbname=artex password=*** \
                 target_session_attrs=read-write",
            ),
            (
                "host=a,b password = 'a \\' s3cret' user=artex",
                "host=a,b password = *** user=artex",
            ),
            ("host=a,b dbname=artex", "host=a,b dbname=artex"),
        ];
        for (url, masked) in cases {
            assert_eq!(mask_password(url), masked, "{url}");
            assert!(!mask_password(url).contains("s3cret"));
        }
    }

    #[test]
    fn both_forms_name_every_host_and_port() {
        for url in [
            "postgresql://u:pw@a:5432,b:5433/artex?target_session_attrs=read-write",
            "host=a,b port=5432,5433 user=u password=pw dbname=artex \
             target_session_attrs=read-write",
        ] {
            let config = tokio_postgres::Config::from_str(url).expect(url);
            assert_eq!(host_list(&config), "a:5432,b:5433", "{url}");
            assert_eq!(
                config.get_target_session_attrs(),
                tokio_postgres::config::TargetSessionAttrs::ReadWrite
            );
            assert_eq!(config.get_dbname(), Some("artex"));
        }
    }

    #[test]
    fn several_hosts_share_the_log_in_deadline() {
        let limits = DbLimits::default();
        let mut one = tokio_postgres::Config::from_str("postgresql://a/db").unwrap();
        one.connect_timeout(limits.connect_timeout);
        share_deadlines(&mut one, &limits);
        assert_eq!(one.get_connect_timeout(), Some(&limits.connect_timeout));
        assert_eq!(one.get_tcp_user_timeout(), None);

        let mut two = tokio_postgres::Config::from_str("postgresql://a,b/db").unwrap();
        share_deadlines(&mut two, &limits);
        assert_eq!(
            two.get_connect_timeout(),
            Some(&(limits.connect_timeout / 2))
        );
        assert_eq!(two.get_tcp_user_timeout(), Some(&limits.connect_timeout));
    }

    #[test]
    fn connections_made_before_a_lost_primary_are_condemned() {
        let before = Instant::now();
        condemn(Instant::now());
        let after = Instant::now() + Duration::from_millis(1);
        assert!(condemned(before));
        assert!(!condemned(after));
    }
}
