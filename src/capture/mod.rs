//! Capture files: reading pcap and pcapng (for `xroce dump`, the golden tests and the
//! benches), writing Ethernet pcap (the simulator's `--pcap`), and turning a capture's
//! link-layer header into the Ethernet frame [`crate::wire`] parses.
//!
//! It sits beside the wire layer, not inside it, as smoltcp keeps its pcap writer beside its
//! wire module: `wire` does no I/O, this module does the file work around it.

mod link;
mod read;
mod write;

pub use link::{
    link_type_name, to_ethernet, EthernetView, LinkError, LINKTYPE_ETHERNET, LINKTYPE_IPV4,
    LINKTYPE_IPV6, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2, LINKTYPE_RAW, LINKTYPE_RAW_12,
    LINKTYPE_RAW_14,
};
pub use read::{read_capture, CaptureError, CaptureReader, CapturedFrame};
pub use write::EthernetPcapWriter;
