//! What one function's device hands to the process that takes it over (issue 22, live update):
//! its state as data ([`DeviceSnapshot`], serde, versioned) and the descriptors that go with it
//! ([`HandoverFiles`], to be passed with `SCM_RIGHTS` between processes). Taken at the
//! function's quiet point ([`crate::control::DeviceState::hand_over`]) and put into a new
//! device by [`crate::control::DeviceState::take_over`].
//!
//! The snapshot holds the register state ([`FunctionState`]), where each running queue stands
//! with the requests it keeps waiting ([`QueueState`]: a SETLKW waiting for its lock is its
//! chain's head, where its reply goes and the engine's name for it), the DMA windows (address,
//! size, offset; the files are in [`HandoverFiles`] in the same order) and which interrupt
//! descriptors the client set. What it does not hold: the vfio-user connection (the
//! transport's), the filesystem's state (the backend's, the waiting lock requests included).

use std::fs::File;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::memory::MemoryError;
use crate::pci::state::{FunctionState, StateError};
use crate::poller::FreezeError;
use crate::poller::QueueState;

/// The format version of [`DeviceSnapshot`] this firmware writes and reads (2: queues with
/// outstanding requests and the waiting ones).
pub const SNAPSHOT_VERSION: u32 = 2;

/// One DMA window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowState {
    /// Guest (IOVA) address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Offset in its file, if it was mapped from one (the file is the next of
    /// [`HandoverFiles::windows`]).
    pub offset: Option<u64>,
}

/// A function's device state as data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// [`SNAPSHOT_VERSION`] when written.
    pub version: u32,
    /// The registers.
    pub function: FunctionState,
    /// Where each running queue stands, with its waiting requests (empty when the driver had
    /// not started the device).
    pub rings: Vec<QueueState>,
    /// The DMA windows, by address.
    pub windows: Vec<WindowState>,
    /// Per MSI-X vector, whether the client set an eventfd (the next of
    /// [`HandoverFiles::msix`]).
    pub msix_fds: Vec<bool>,
    /// Whether the client set a device-request eventfd.
    pub request_fd: bool,
    /// Whether the doorbells' area is memory the client maps (its file is
    /// [`HandoverFiles::notify`]).
    pub notify_mem: bool,
    /// The device's statistics at the quiet point: the taker's counters continue from them.
    #[serde(default)]
    pub stats: crate::stats::DeviceStats,
    /// Whether the queues' in-flight record comes along (its file is
    /// [`HandoverFiles::inflight`]): the taker goes on writing it.
    #[serde(default)]
    pub inflight: bool,
    /// A checkpoint for crash recovery ([`crate::control::DeviceState::checkpoint`]): no ring
    /// positions; the queues resume from the in-flight record.
    #[serde(default)]
    pub checkpoint: bool,
}

/// The descriptors of a [`DeviceSnapshot`], in its order.
#[derive(Debug, Default)]
pub struct HandoverFiles {
    /// The files of the windows with an offset.
    pub windows: Vec<File>,
    /// The MSI-X eventfds the snapshot marks as set.
    pub msix: Vec<File>,
    /// The device-request eventfd.
    pub request: Option<File>,
    /// The doorbells' area the client maps (the same file, so its mapping stays the device's).
    pub notify: Option<File>,
    /// The queues' in-flight record (a checkpoint's).
    pub inflight: Option<File>,
}

/// A function's device, handed over.
#[derive(Debug)]
pub struct DeviceHandover {
    /// Its state.
    pub snapshot: DeviceSnapshot,
    /// Its descriptors.
    pub files: HandoverFiles,
}

/// Why a device could not be handed over or taken over. The device that was to hand over goes
/// on serving after any of these ([`crate::control::DeviceState::resume_serving`]).
#[derive(Debug, Error)]
pub enum HandoverError {
    /// The function is not at a quiet point (a SETLKW waits) or a poller did not answer.
    #[error("the function did not come to its quiet point")]
    Freeze(#[from] FreezeError),
    /// A system call failed (duplicating a descriptor, setting up the taker's event loop).
    #[error("a system call failed")]
    Io(#[from] std::io::Error),
    /// The snapshot is of another format version.
    #[error("device snapshot format {found}, this firmware reads {expected}")]
    Version {
        /// The snapshot's.
        found: u32,
        /// This firmware's.
        expected: u32,
    },
    /// The register state does not fit the new function.
    #[error("register state")]
    State(#[from] StateError),
    /// The descriptors do not match the snapshot.
    #[error("the descriptors do not match the snapshot: {0}")]
    Files(String),
    /// The server did not offer its state in time.
    #[error("the server did not offer its function within its bound")]
    NoOffer,
    /// A window could not be mapped again.
    #[error("DMA window")]
    Memory(#[from] MemoryError),
}
