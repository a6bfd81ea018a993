//! The vfio-user messages this client speaks: command numbers, header flags, and the fixed
//! request/reply structures, encoded by [`wire_struct!`](crate::wire_struct) (no `unsafe`).

use crate::wire_struct;

/// vfio-user command numbers.
pub mod command {
    /// Version and capability negotiation.
    pub const VERSION: u16 = 1;
    /// Map client memory for DMA.
    pub const DMA_MAP: u16 = 2;
    /// Unmap client memory.
    pub const DMA_UNMAP: u16 = 3;
    /// Basic device information.
    pub const DEVICE_GET_INFO: u16 = 4;
    /// Region information (and capability chain, mmap fd).
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    /// ioeventfd/ioregionfd information (not used by this client).
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    /// Interrupt type information.
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    /// Set interrupt actions (eventfds).
    pub const DEVICE_SET_IRQS: u16 = 8;
    /// Read from a region.
    pub const REGION_READ: u16 = 9;
    /// Write to a region.
    pub const REGION_WRITE: u16 = 10;
    /// Server reads client memory (not supported: this client always shares memory by fd).
    pub const DMA_READ: u16 = 11;
    /// Server writes client memory (not supported).
    pub const DMA_WRITE: u16 = 12;
    /// Reset the device.
    pub const DEVICE_RESET: u16 = 13;
    /// Coalesced region writes.
    pub const REGION_WRITE_MULTI: u16 = 15;
}

/// Header flag bits.
pub mod flags {
    /// Mask of the message type.
    pub const TYPE_MASK: u32 = 0xf;
    /// Type: command.
    pub const TYPE_COMMAND: u32 = 0;
    /// Type: reply.
    pub const TYPE_REPLY: u32 = 1;
    /// The command wants no reply.
    pub const NO_REPLY: u32 = 1 << 4;
    /// The reply reports an error; the header's error field holds the errno.
    pub const ERROR: u32 = 1 << 5;
}

/// DMA_MAP flag: readable by the device.
pub const DMA_MAP_FLAG_READ: u32 = 1;
/// DMA_MAP flag: writeable by the device.
pub const DMA_MAP_FLAG_WRITE: u32 = 2;
/// DMA_UNMAP flag: unmap all regions (address and size must be 0).
pub const DMA_UNMAP_FLAG_ALL: u32 = 2;

/// Size of the message header.
pub const HEADER_SIZE: usize = 16;
/// Size of `struct vfio_region_info`.
pub const REGION_INFO_SIZE: usize = 32;

/// Largest reply this client accepts (guards against a server announcing a huge message).
pub(super) const MAX_REPLY_SIZE: u32 = 64 << 20;
/// Largest region-info reply (caps included) the client asks for.
pub(super) const MAX_REGION_INFO_ARGSZ: u32 = 64 << 10;
/// Default `max_data_xfer_size` (spec default, used when the server does not say).
pub(super) const DEFAULT_MAX_DATA_XFER: u32 = 1 << 20;

wire_struct! {
    /// The 16-byte message header.
    pub struct Header {
        /// Message id, echoed in the reply.
        pub msg_id: u16,
        /// Command number (see [`command`]).
        pub command: u16,
        /// Size of the whole message, header included.
        pub msg_size: u32,
        /// Flags (see [`flags`]).
        pub flags: u32,
        /// errno of an error reply.
        pub error: u32,
    }
}

impl Header {
    /// The type bits (0 command, 1 reply).
    pub fn msg_type(&self) -> u32 {
        self.flags & flags::TYPE_MASK
    }
    /// Whether the error bit is set.
    pub fn is_error(&self) -> bool {
        self.flags & flags::ERROR != 0
    }
}

wire_struct! {
    /// VERSION request and reply head (the JSON capabilities follow, NUL-terminated).
    pub struct Version {
        /// Major version (0).
        pub major: u16,
        /// Minor version.
        pub minor: u16,
    }
}

wire_struct! {
    /// DMA_MAP request payload.
    pub struct DmaMap {
        /// Size of this structure (32).
        pub argsz: u32,
        /// [`DMA_MAP_FLAG_READ`] | [`DMA_MAP_FLAG_WRITE`].
        pub flags: u32,
        /// Offset into the passed file descriptor.
        pub offset: u64,
        /// DMA (IOVA) address.
        pub address: u64,
        /// Size of the mapping.
        pub size: u64,
    }
}

wire_struct! {
    /// DMA_UNMAP request payload; the reply echoes it.
    pub struct DmaUnmap {
        /// Maximum reply payload size.
        pub argsz: u32,
        /// [`DMA_UNMAP_FLAG_ALL`] or 0.
        pub flags: u32,
        /// DMA address of the mapping.
        pub address: u64,
        /// Size of the mapping.
        pub size: u64,
    }
}

wire_struct! {
    /// DEVICE_GET_INFO request and reply payload.
    pub struct DeviceInfo {
        /// Request: max reply size; reply: size needed.
        pub argsz: u32,
        /// `VFIO_DEVICE_FLAGS_*` (bit 0 reset, bit 1 PCI).
        pub flags: u32,
        /// Number of regions.
        pub num_regions: u32,
        /// Number of IRQ types.
        pub num_irqs: u32,
    }
}

wire_struct! {
    /// `struct vfio_region_info`: DEVICE_GET_REGION_INFO request and reply head.
    pub struct RegionInfoRaw {
        /// Request: max reply size; reply: size needed for the full payload.
        pub argsz: u32,
        /// `VFIO_REGION_INFO_FLAG_*`.
        pub flags: u32,
        /// Region index.
        pub index: u32,
        /// Offset of the first capability, relative to the start of this structure.
        pub cap_offset: u32,
        /// Region size.
        pub size: u64,
        /// mmap offset of the region in the returned fd.
        pub offset: u64,
    }
}

wire_struct! {
    /// `struct vfio_irq_info`: DEVICE_GET_IRQ_INFO request and reply payload.
    pub struct IrqInfo {
        /// Request: max reply size; reply: size needed.
        pub argsz: u32,
        /// `VFIO_IRQ_INFO_*`.
        pub flags: u32,
        /// IRQ type index (e.g. 2 = MSI-X).
        pub index: u32,
        /// Number of interrupts of this type.
        pub count: u32,
    }
}

wire_struct! {
    /// `struct vfio_irq_set` head: DEVICE_SET_IRQS request payload (data follows).
    pub struct IrqSet {
        /// Size of the payload, data included.
        pub argsz: u32,
        /// `VFIO_IRQ_SET_DATA_*` | `VFIO_IRQ_SET_ACTION_*`.
        pub flags: u32,
        /// IRQ type index.
        pub index: u32,
        /// First sub-index.
        pub start: u32,
        /// Number of sub-indexes.
        pub count: u32,
    }
}

wire_struct! {
    /// REGION_READ/REGION_WRITE request head and reply head.
    pub struct RegionAccess {
        /// Offset into the region.
        pub offset: u64,
        /// Region index.
        pub region: u32,
        /// Number of bytes.
        pub count: u32,
    }
}

wire_struct! {
    /// `struct vfio_info_cap_header`.
    pub struct CapHeader {
        /// Capability id.
        pub id: u16,
        /// Capability version.
        pub version: u16,
        /// Offset of the next capability (from the start of the region info), 0 = end.
        pub next: u32,
    }
}

wire_struct! {
    /// The sparse-mmap capability's body after its [`CapHeader`] (`struct
    /// vfio_region_info_cap_sparse_mmap`); `nr_areas` [`SparseArea`]s follow.
    pub struct SparseMmapHead {
        /// Number of areas.
        pub nr_areas: u32,
        /// Padding.
        pub reserved: u32,
    }
}

wire_struct! {
    /// One area of the sparse-mmap capability.
    pub struct SparseArea {
        /// Offset of the area in the region (add the region's mmap offset for `mmap`).
        pub offset: u64,
        /// Size of the area.
        pub size: u64,
    }
}
