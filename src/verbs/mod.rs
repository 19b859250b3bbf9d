//! The libibverbs-like public API: device, protection domain, memory region, completion
//! queue and channel, queue pair, address handle; a progress thread per device.
pub mod attr;

pub use attr::{DeviceAttr, LinkLayer, PortAttr, PortState};
