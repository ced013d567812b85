//! Cluster-level housekeeping that runs outside any artex database: creating the database
//! artex lives in (embedded cluster, tests, benchmark).

use std::str::FromStr;

use tokio_postgres::NoTls;

use super::sql::quote_ident;
use crate::error::{Error, Result};

/// Creates database `name` through `admin_url` (a connection to another database of the
/// same cluster) unless it exists; `template` clones it from another database. Returns
/// whether it created it.
pub async fn create_database(admin_url: &str, name: &str, template: Option<&str>) -> Result<bool> {
    let config = tokio_postgres::Config::from_str(admin_url)
        .map_err(|e| Error::Url(format!("{e} (in {})", super::mask_password(admin_url))))?;
    let (client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    let exists = client
        .query_opt("select 1 from pg_database where datname = $1", &[&name])
        .await?
        .is_some();
    let mut created = false;
    if !exists {
        let mut sql = format!("create database {}", quote_ident(name));
        if let Some(t) = template {
            sql.push_str(&format!(" template {}", quote_ident(t)));
        }
        match client.batch_execute(&sql).await {
            Ok(()) => created = true,
            // Another process created it in the meantime: that is what we wanted.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {}
            Err(e) => return Err(e.into()),
        }
    }
    drop(client);
    let _ = driver.await;
    Ok(created)
}

/// Drops database `name` (forcing its sessions off) if it exists.
pub async fn drop_database(admin_url: &str, name: &str) -> Result {
    let config = tokio_postgres::Config::from_str(admin_url)
        .map_err(|e| Error::Url(format!("{e} (in {})", super::mask_password(admin_url))))?;
    let (client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "drop database if exists {} with (force)",
            quote_ident(name)
        ))
        .await?;
    drop(client);
    let _ = driver.await;
    Ok(())
}
