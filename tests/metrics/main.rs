//! Metrics an on-call can alert on (issue 37): the fleet's figures `artex serve` reads
//! from the blackboard, the shipped alert rules, and a real Prometheus scraping serve, a
//! worker and a planner.
//!
//! # Layout
//! - `fleet`: `artex.fleet_metrics` on real PostgreSQL: counts by kind and status, the
//!   oldest runnable task's age, outcome counters that survive the history's retention
//!   and never skip a transaction still in flight.
//! - `prometheus`: `promtool` checks and unit-tests docs/alerts.yml; Prometheus scrapes
//!   real `artex serve`, worker and planner processes, each scrape is valid text
//!   format, and the backlog it reads through its HTTP API is the database's.

#[path = "../common/mod.rs"]
mod common;

mod fleet;
mod prometheus;
