//! The vfio-user wire format this server speaks (the subset a PCI device
//! needs): message header, commands, the VFIO constants they carry.
//!
//! All integers are little-endian; a message is a 16-byte header followed
//! by `message_size - 16` bytes of body; file descriptors travel as
//! SCM_RIGHTS with the header.

/// Header bytes.
pub const HEADER: usize = 16;
/// Largest message accepted (header included): the biggest legitimate one
/// is a VERSION with its capabilities string. A larger size is a protocol
/// error that ends the connection (the stream cannot be resynchronised).
pub const MAX_MESSAGE: usize = 4096;
/// Most file descriptors taken with one message.
pub const MAX_FDS: usize = 16;
/// Largest region access (bytes): the device's registers are at most 64 bits.
pub const MAX_ACCESS: u32 = 8;

/// vfio-user commands.
pub mod cmd {
    /// VERSION.
    pub const VERSION: u16 = 1;
    /// DMA_MAP.
    pub const DMA_MAP: u16 = 2;
    /// DMA_UNMAP.
    pub const DMA_UNMAP: u16 = 3;
    /// DEVICE_GET_INFO.
    pub const DEVICE_GET_INFO: u16 = 4;
    /// DEVICE_GET_REGION_INFO.
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    /// DEVICE_GET_REGION_IO_FDS (not supported).
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    /// DEVICE_GET_IRQ_INFO.
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    /// DEVICE_SET_IRQS.
    pub const DEVICE_SET_IRQS: u16 = 8;
    /// REGION_READ.
    pub const REGION_READ: u16 = 9;
    /// REGION_WRITE.
    pub const REGION_WRITE: u16 = 10;
    /// DMA_READ (not supported: every map has an fd).
    pub const DMA_READ: u16 = 11;
    /// DMA_WRITE (not supported).
    pub const DMA_WRITE: u16 = 12;
    /// DEVICE_RESET.
    pub const DEVICE_RESET: u16 = 13;
    /// DIRTY_PAGES (not supported).
    pub const DIRTY_PAGES: u16 = 14;
}

/// Header flags: message type in bits 3:0.
pub const TYPE_MASK: u32 = 0xF;
/// Message type: command.
pub const TYPE_COMMAND: u32 = 0;
/// Message type: reply.
pub const TYPE_REPLY: u32 = 1;
/// Header flag: the sender wants no reply.
pub const FLAG_NO_REPLY: u32 = 1 << 4;
/// Header flag: the reply is an error (errno in the header's error field).
pub const FLAG_ERROR: u32 = 1 << 5;

/// `vfio_device_info.flags`: resettable.
pub const DEVICE_FLAGS_RESET: u32 = 1 << 0;
/// `vfio_device_info.flags`: a PCI device.
pub const DEVICE_FLAGS_PCI: u32 = 1 << 1;

/// VFIO PCI region index of BAR0.
pub const REGION_BAR0: u32 = 0;
/// VFIO PCI region index of BAR2.
pub const REGION_BAR2: u32 = 2;
/// VFIO PCI region index of the configuration space.
pub const REGION_CONFIG: u32 = 7;
/// VFIO PCI regions (BAR0..5, ROM, config, VGA).
pub const NUM_REGIONS: u32 = 9;
/// `vfio_region_info.flags`: readable.
pub const REGION_FLAG_READ: u32 = 1 << 0;
/// `vfio_region_info.flags`: writable.
pub const REGION_FLAG_WRITE: u32 = 1 << 1;
/// `vfio_region_info.flags`: mmap-able (the reply carries the fd).
pub const REGION_FLAG_MMAP: u32 = 1 << 2;
/// `vfio_region_info.flags`: a capability list follows.
pub const REGION_FLAG_CAPS: u32 = 1 << 3;
/// Region capability id: sparse mmap areas.
pub const REGION_CAP_SPARSE_MMAP: u16 = 1;
/// `vfio_region_info` bytes (the capability list starts after it).
pub const REGION_INFO: u32 = 32;
/// The BAR2 reply's capability list: header (8), sparse header (8), one
/// area (16).
pub const BAR2_CAPS: u32 = 32;

/// VFIO PCI IRQ index of MSI-X.
pub const IRQ_MSIX: u32 = 2;
/// VFIO PCI IRQ indices (INTx, MSI, MSI-X, ERR, REQ).
pub const NUM_IRQS: u32 = 5;
/// `vfio_irq_info.flags`: eventfd signalling.
pub const IRQ_INFO_EVENTFD: u32 = 1 << 0;
/// `vfio_irq_info.flags`: the count cannot change.
pub const IRQ_INFO_NORESIZE: u32 = 1 << 3;

/// `vfio_irq_set.flags`: no data.
pub const IRQ_SET_DATA_NONE: u32 = 1 << 0;
/// `vfio_irq_set.flags`: bool data (not supported).
pub const IRQ_SET_DATA_BOOL: u32 = 1 << 1;
/// `vfio_irq_set.flags`: eventfds as data.
pub const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
/// `vfio_irq_set.flags`: mask.
pub const IRQ_SET_ACTION_MASK: u32 = 1 << 3;
/// `vfio_irq_set.flags`: unmask.
pub const IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
/// `vfio_irq_set.flags`: trigger.
pub const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

/// DMA_UNMAP flag: unmap everything.
pub const DMA_UNMAP_ALL: u32 = 1 << 2;
/// DMA_UNMAP flag: dirty page bitmap (not supported).
pub const DMA_UNMAP_DIRTY: u32 = 1 << 1;

/// A message header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Message id (echoed in the reply).
    pub id: u16,
    /// Command.
    pub command: u16,
    /// Bytes of the whole message.
    pub size: u32,
    /// Flags.
    pub flags: u32,
    /// errno of an error reply.
    pub error: u32,
}

impl Header {
    /// Decodes 16 bytes.
    pub fn decode(b: &[u8; HEADER]) -> Self {
        Header {
            id: u16::from_le_bytes([b[0], b[1]]),
            command: u16::from_le_bytes([b[2], b[3]]),
            size: u32_at(b, 4),
            flags: u32_at(b, 8),
            error: u32_at(b, 12),
        }
    }

    /// Encodes 16 bytes.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..2].copy_from_slice(&self.id.to_le_bytes());
        b[2..4].copy_from_slice(&self.command.to_le_bytes());
        b[4..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.error.to_le_bytes());
        b
    }
}

/// The u32 at `off` of `b` (the caller checked the length).
pub fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(v)
}

/// The u64 at `off` of `b` (the caller checked the length).
pub fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(v)
}

/// The capabilities string of the server's VERSION reply (as the
/// `vfio_user` crate's server sends it).
pub const SERVER_CAPABILITIES: &str = r#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"migration":{"pgsize":4096}}}"#;
