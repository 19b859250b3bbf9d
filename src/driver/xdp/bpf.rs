//! Loading `bpf/xroce_xdp.c` (compiled by build.rs, embedded here) and attaching it to an
//! interface through a BPF link, so the kernel detaches it when the last reference to the
//! link goes away: when the driver is dropped, and also when the process dies.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder, Xdp, XdpFlags};
use rustix::io::Errno;

use crate::driver::{DriverError, XdpStats};

/// The compiled XDP program (ELF object with BTF).
pub static XDP_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xroce_xdp.o"));

/// Counter slots of the `counters` map, in the order of the C enum.
const CNT_SEEN: u32 = 0;
const CNT_REDIRECTED: u32 = 1;
const CNT_PASSED: u32 = 2;
const CNT_MALFORMED: u32 = 3;
const CNT_NO_SOCKET: u32 = 4;
const CNT_UNSUPPORTED: u32 = 5;

/// How the XDP program is attached to the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Native (driver) mode if the NIC driver supports it for this MTU, else generic.
    #[default]
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (SKB) mode: works on any interface, after the kernel built an skb.
    Generic,
}

/// The loaded program, its maps, and (once attached) the link that keeps it on the interface.
pub struct XdpProgram {
    // Declared first so it is dropped first: the program leaves the interface before the
    // maps and the object go away.
    link: Option<OwnedFd>,
    attached_mode: Option<&'static str>,
    object: Object,
}

impl std::fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpProgram")
            .field("attached_mode", &self.attached_mode)
            .finish_non_exhaustive()
    }
}

fn bpf_error(what: &str, err: libbpf_rs::Error) -> DriverError {
    let text = format!("{err:#}");
    if err.kind() == libbpf_rs::ErrorKind::PermissionDenied
        || text.contains("Operation not permitted")
    {
        DriverError::NotPermitted {
            what: what.to_string(),
        }
    } else {
        DriverError::Bpf {
            reason: format!("{what}: {text}"),
        }
    }
}

impl XdpProgram {
    /// Load the embedded program into the kernel (not yet attached anywhere).
    pub fn load() -> Result<Self, DriverError> {
        let open = ObjectBuilder::default()
            .open_memory(XDP_OBJECT)
            .map_err(|e| bpf_error("opening the embedded XDP object", e))?;
        let object = open
            .load()
            .map_err(|e| bpf_error("loading the XDP program into the kernel", e))?;
        Ok(XdpProgram {
            link: None,
            attached_mode: None,
            object,
        })
    }

    fn program(&self) -> Result<libbpf_rs::Program<'_>, DriverError> {
        self.object
            .progs()
            .find(|p| p.name() == XROCE_PROG_NAME)
            .ok_or_else(|| DriverError::Bpf {
                reason: "program xroce_xdp missing from the embedded object".into(),
            })
    }

    fn map(&self, name: &str) -> Result<libbpf_rs::Map<'_>, DriverError> {
        self.object
            .maps()
            .find(|m| m.name() == name)
            .ok_or_else(|| DriverError::Bpf {
                reason: format!("map {name} missing from the embedded object"),
            })
    }

    /// Put an AF_XDP socket into the XSKMAP slot of receive queue `queue`.
    pub fn register_socket(&self, queue: u32, socket_fd: RawFd) -> Result<(), DriverError> {
        self.map("xsks")?
            .update(
                &queue.to_ne_bytes(),
                &(socket_fd as u32).to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(|e| bpf_error(&format!("adding the AF_XDP socket to xsks[{queue}]"), e))
    }

    /// Attach to `ifindex` through a BPF link. `ifname` is only for messages.
    pub fn attach(
        &mut self,
        ifindex: u32,
        ifname: &str,
        mode: AttachMode,
    ) -> Result<&'static str, DriverError> {
        let (result, name) = {
            let prog = self.program()?;
            let try_mode = |flags: u32| link_create(prog.as_fd(), ifindex, flags);
            match mode {
                AttachMode::Native => (try_mode(libbpf_sys::XDP_FLAGS_DRV_MODE), "native"),
                AttachMode::Generic => (try_mode(libbpf_sys::XDP_FLAGS_SKB_MODE), "generic"),
                AttachMode::Auto => match try_mode(libbpf_sys::XDP_FLAGS_DRV_MODE) {
                    Ok(fd) => (Ok(fd), "native"),
                    // veth refuses native XDP when the MTU exceeds one page (ERANGE); other
                    // drivers have no native XDP (EOPNOTSUPP) or reject the flags (EINVAL).
                    Err(Errno::RANGE | Errno::OPNOTSUPP | Errno::INVAL) => {
                        (try_mode(libbpf_sys::XDP_FLAGS_SKB_MODE), "generic")
                    }
                    Err(e) => (Err(e), "native"),
                },
            }
        };
        match result {
            Ok(fd) => {
                self.link = Some(fd);
                self.attached_mode = Some(name);
                Ok(name)
            }
            Err(e) => Err(match e {
                Errno::BUSY | Errno::EXIST => {
                    let prog_id = self.attached_prog_id(ifindex).unwrap_or(0);
                    if prog_id != 0 && is_xroce_program(prog_id) {
                        DriverError::XroceAlreadyAttached {
                            ifname: ifname.to_string(),
                            prog_id,
                        }
                    } else {
                        DriverError::XdpProgramAttached {
                            ifname: ifname.to_string(),
                            prog_id,
                        }
                    }
                }
                Errno::NODEV => DriverError::InterfaceMissing {
                    ifname: ifname.to_string(),
                },
                _ => DriverError::io(
                    format!("attaching the XDP program to {ifname:?} in {name} mode"),
                    e.into(),
                ),
            }),
        }
    }

    /// The id of the XDP program attached to `ifindex` in any mode, if one is.
    fn attached_prog_id(&self, ifindex: u32) -> Option<u32> {
        let prog = self.program().ok()?;
        let id = Xdp::new(prog.as_fd())
            .query_id(ifindex as i32, XdpFlags::NONE)
            .ok()?;
        (id != 0).then_some(id)
    }

    /// How the program is attached ("native", "generic"), if it is.
    pub fn attached_mode(&self) -> Option<&'static str> {
        self.attached_mode
    }

    /// The counters, summed over all CPUs (socket fields left at 0).
    pub fn stats(&self) -> Result<XdpStats, DriverError> {
        let map = self.map("counters")?;
        let read = |key: u32| -> Result<u64, DriverError> {
            let per_cpu = map
                .lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| bpf_error("reading the XDP counters", e))?
                .unwrap_or_default();
            Ok(per_cpu
                .iter()
                .filter_map(|v| v.get(..8))
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .sum())
        };
        Ok(XdpStats {
            seen: read(CNT_SEEN)?,
            redirected: read(CNT_REDIRECTED)?,
            passed: read(CNT_PASSED)?,
            malformed: read(CNT_MALFORMED)?,
            no_socket: read(CNT_NO_SOCKET)?,
            unsupported: read(CNT_UNSUPPORTED)?,
            ..XdpStats::default()
        })
    }
}

/// Whether the program with kernel id `id` is xroce's own (its name is `xroce_xdp`, the
/// function in bpf/xroce_xdp.c): then another xroce process holds the interface.
pub fn is_xroce_program(id: u32) -> bool {
    libbpf_rs::query::ProgInfoIter::default()
        .any(|p| p.id == id && p.name.to_bytes() == XROCE_PROG_NAME.as_bytes())
}

/// The name of the XDP program in bpf/xroce_xdp.c (the kernel keeps 15 characters).
pub const XROCE_PROG_NAME: &str = "xroce_xdp";

/// A BPF link attaching the XDP program `prog` to `ifindex` with `flags` (the attach mode).
/// libbpf-rs attaches XDP through a link only without flags, so this calls libbpf itself.
fn link_create(prog: BorrowedFd<'_>, ifindex: u32, flags: u32) -> Result<OwnedFd, Errno> {
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        flags,
        // All zero (libbpf's "no options") for the rest, as its OPTS macros set it.
        ..Default::default()
    };
    // Safety: `prog` is a loaded program's descriptor, open for the whole call; `opts` is a
    // valid, initialised options struct whose `sz` tells libbpf its size. The call reads
    // them only and returns a new descriptor or a negative errno.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(prog.as_raw_fd(), ifindex as i32, libbpf_sys::BPF_XDP, &opts)
    };
    if fd < 0 {
        return Err(Errno::from_raw_os_error(-fd));
    }
    // Safety: a non-negative return is a new link descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_object_is_a_bpf_elf_with_btf() {
        assert_eq!(&XDP_OBJECT[..4], b"\x7fELF");
        // e_machine at offset 18 (little endian): EM_BPF = 247.
        assert_eq!(u16::from_le_bytes([XDP_OBJECT[18], XDP_OBJECT[19]]), 247);
        let has = |needle: &[u8]| XDP_OBJECT.windows(needle.len()).any(|w| w == needle);
        assert!(has(b".BTF\0"), "BTF is needed for the map definitions");
        assert!(has(b"xroce_xdp\0") && has(b"xsks\0") && has(b"counters\0"));
    }
}
