//! The daemon's logger: one line per record, as text (`2026-01-31T12:00:00.123Z INFO target:
//! message`) or as a JSON object (`{"ts":..., "level":..., "target":..., "msg":...}`), to
//! stderr or to the local syslog socket (`/dev/log`, RFC 3164 framing with facility `daemon`:
//! what journald and rsyslog read). The level is `log`'s global maximum, so the control
//! socket's `set_log_level` changes it at run time.

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::time::{SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// How records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `TIME LEVEL target: message`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Why the logger could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoggerError {
    /// The syslog socket could not be reached.
    #[error("syslog socket {path}")]
    Syslog {
        /// The socket's path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A logger was installed already.
    #[error("a logger is installed already")]
    Installed,
}

/// The local syslog socket.
pub const SYSLOG_SOCKET: &str = "/dev/log";

struct Logger {
    format: LogFormat,
    syslog: Option<UnixDatagram>,
}

/// Installs the logger: records up to `level` in `format`, to syslog if `syslog`, else stderr.
pub fn init(level: LevelFilter, format: LogFormat, syslog: bool) -> Result<(), LoggerError> {
    let syslog = if syslog {
        let err = |source| LoggerError::Syslog { path: SYSLOG_SOCKET.into(), source };
        let s = UnixDatagram::unbound().map_err(err)?;
        s.connect(SYSLOG_SOCKET).map_err(err)?;
        Some(s)
    } else {
        None
    };
    let logger: &'static Logger = Box::leak(Box::new(Logger { format, syslog }));
    log::set_logger(logger).map_err(|_| LoggerError::Installed)?;
    log::set_max_level(level);
    Ok(())
}

/// `secs` since the epoch as a UTC civil date and time (Howard Hinnant's `civil_from_days`).
fn utc(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, (rem / 3600) as u32, (rem / 60 % 60) as u32, (rem % 60) as u32)
}

/// The time now in RFC 3339, UTC, milliseconds.
pub fn timestamp() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let (y, mo, d, h, mi, s) = utc(now.as_secs());
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z", now.subsec_millis())
}

fn severity(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

impl Logger {
    fn line(&self, record: &Record<'_>) -> String {
        let msg = record.args().to_string();
        match self.format {
            LogFormat::Json => serde_json::json!({
                "ts": timestamp(),
                "level": record.level().as_str().to_lowercase(),
                "target": record.target(),
                "msg": msg,
            })
            .to_string(),
            LogFormat::Text if self.syslog.is_some() => format!("{}: {msg}", record.target()),
            LogFormat::Text => format!("{} {:<5} {}: {msg}", timestamp(), record.level(), record.target()),
        }
    }
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = self.line(record);
        match &self.syslog {
            Some(s) => {
                // Facility daemon (3).
                let pri = 3 * 8 + severity(record.level());
                let msg = format!("<{pri}>virtiofs-dpu[{}]: {line}", std::process::id());
                let _ = s.send(msg.as_bytes());
            }
            None => {
                // One write per record: records of two processes on one stderr (a live update's
                // old and new serving processes) do not run together.
                let mut line = line;
                line.push('\n');
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(utc(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(utc(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(utc(1_767_225_599), (2025, 12, 31, 23, 59, 59));
    }
}
