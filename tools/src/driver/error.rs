//! The driver's error type.

use crate::memory::MemoryError;
use crate::pci::PciError;
use crate::vfio_user::ClientError;
use crate::virtio::TransportError;
use crate::virtqueue::QueueError;

/// Errors of the driver.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// vfio-user failure.
    #[error("vfio-user")]
    Client(#[from] ClientError),
    /// Config space problem.
    #[error("PCI")]
    Pci(#[from] PciError),
    /// Register access or transport-level device misbehaviour.
    #[error("virtio transport")]
    Transport(#[from] TransportError),
    /// Guest memory problem.
    #[error("guest memory")]
    Memory(#[from] MemoryError),
    /// Virtqueue problem (includes `QueueError::Full`).
    #[error("virtqueue")]
    Queue(#[from] QueueError),
    /// The device does something a virtio-fs device must not.
    #[error("device misbehaves: {0}")]
    Device(String),
    /// A FUSE reply breaks the protocol.
    #[error("bad FUSE reply to opcode {opcode}: {reason}")]
    BadReply {
        /// Request opcode.
        opcode: u32,
        /// What was wrong.
        reason: String,
    },
    /// The FUSE server answered with an error.
    #[error("FUSE opcode {opcode} failed with errno {errno}")]
    Fuse {
        /// Request opcode.
        opcode: u32,
        /// Positive errno.
        errno: i32,
    },
    /// No completion within the timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The options require a feature the device does not offer.
    #[error("the device does not offer {name} (feature bit {bit}), which the options require")]
    FeatureNotOffered {
        /// Feature name, e.g. `VIRTIO_F_RING_PACKED`.
        name: &'static str,
        /// Feature bit number.
        bit: u32,
    },
    /// The driver cannot do this.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// OS error (eventfd, epoll).
    #[error("OS error")]
    Io(#[from] std::io::Error),
}

impl DriverError {
    /// Whether this is a queue-full condition.
    pub fn is_queue_full(&self) -> bool {
        matches!(self, DriverError::Queue(QueueError::Full { .. }))
    }
    /// The FUSE errno, if the server returned one.
    pub fn fuse_errno(&self) -> Option<i32> {
        match self {
            DriverError::Fuse { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Result type of the driver.
pub type Result<T> = std::result::Result<T, DriverError>;

/// A [`DriverError::Device`].
pub(super) fn device(s: impl Into<String>) -> DriverError {
    DriverError::Device(s.into())
}
