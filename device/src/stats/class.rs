//! What a request is for the statistics: its operation class ([`OpClass`], as the request
//! handler names it) and what the handler reports of it ([`Tally`]).

use serde::{Deserialize, Serialize};

/// What kind of operation a request is, as the request handler classifies it (the device keeps
/// a latency histogram and counters per class and knows nothing else of the protocol).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpClass {
    /// Reads of file data.
    Read,
    /// Writes of file data.
    Write,
    /// Name and attribute operations (lookup, getattr, create, readdir, ...).
    Metadata,
    /// Everything else (session, locks, sync, a request the handler could not read).
    #[default]
    Other,
}

impl OpClass {
    /// Every class, in index order.
    pub const ALL: [OpClass; 4] = [OpClass::Read, OpClass::Write, OpClass::Metadata, OpClass::Other];

    /// Its index in [`Self::ALL`].
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Read => "read",
            OpClass::Write => "write",
            OpClass::Metadata => "metadata",
            OpClass::Other => "other",
        }
    }
}

/// What a request handler reports of a request, for the statistics: its class, the errno it
/// failed with (0: it succeeded) and the bytes of file data it moved (read or written, by class).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// The operation's class.
    pub class: OpClass,
    /// The errno it was answered with, 0 for success.
    pub errno: u16,
    /// File data read (class read) or written (class write), in bytes.
    pub bytes: u32,
}
