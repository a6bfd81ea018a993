//! Operating the daemon: its control socket ([`control_socket`], JSON-RPC 2.0), the reports of
//! `virtiofs-dpu stats` ([`report`]: a table, JSON, the Prometheus text format), its logger
//! ([`logger`]: text or JSON lines, stderr or syslog, a level changeable at run time) and what a
//! supervisor needs ([`deploy`]: socket ownership and mode, a listening socket handed over,
//! `sd_notify`).

pub mod control_socket;
pub mod deploy;
pub mod logger;
pub mod report;
