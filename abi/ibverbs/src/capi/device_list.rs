//! `ibv_get_device_list` and friends: one device per network interface, named
//! `xroce_<ifname>` as `xroce devinfo` names it.
//!
//! The `ibv_device` structs live for the whole process (programs keep device pointers past
//! `ibv_free_device_list`, and rdma-core keeps them too), one per interface name; a list is
//! an array of pointers to them.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use xroce::netdev::{self, NetdevInfo};

use super::config::LibraryConfig;
use super::{lock, set_errno, RawObj};
use crate::objects::{ibv_device, IBV_SYSFS_NAME_MAX, IBV_SYSFS_PATH_MAX};

/// `IBV_NODE_CA`.
const IBV_NODE_CA: u32 = 1;
/// `IBV_TRANSPORT_IB`: RoCE runs the IB transport (rxe reports the same).
const IBV_TRANSPORT_IB: u32 = 0;

/// A device as the library keeps it: the C struct first, then the interface it stands for.
#[repr(C)]
pub(crate) struct DeviceEntry {
    pub c: ibv_device,
    pub ifname: String,
}

/// Every device handed out so far, by interface name (never freed: see the module doc).
fn known() -> &'static Mutex<HashMap<String, RawObj>> {
    static KNOWN: OnceLock<Mutex<HashMap<String, RawObj>>> = OnceLock::new();
    KNOWN.get_or_init(|| Mutex::new(HashMap::new()))
}

fn copy_c_string(dst: &mut [c_char], text: &str) {
    let bytes = text.as_bytes();
    let n = bytes.len().min(dst.len() - 1);
    for (d, s) in dst.iter_mut().zip(&bytes[..n]) {
        *d = *s as c_char;
    }
    dst[n] = 0;
}

pub(crate) fn entry_for(ifname: &str) -> *mut DeviceEntry {
    let mut known = lock(known());
    if let Some(raw) = known.get(ifname) {
        return raw.ptr();
    }
    let mut c = ibv_device {
        _ops: crate::objects::_ibv_device_ops {
            _dummy1: None,
            _dummy2: None,
        },
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        name: [0; IBV_SYSFS_NAME_MAX],
        dev_name: [0; IBV_SYSFS_NAME_MAX],
        dev_path: [0; IBV_SYSFS_PATH_MAX],
        ibdev_path: [0; IBV_SYSFS_PATH_MAX],
    };
    let name = format!("xroce_{ifname}");
    copy_c_string(&mut c.name, &name);
    copy_c_string(&mut c.dev_name, &name);
    if let Err(e) = ensure_device_node(Path::new(DEVICE_NODE_DIR), &name) {
        // Without the privilege to make it there is nothing to say: the verbs work, and
        // docs/engines.md tells what UCX needs.
        if e.kind() != std::io::ErrorKind::PermissionDenied && !LibraryConfig::get().quiet {
            eprintln!("xroce: cannot make {DEVICE_NODE_DIR}/{name} ({e}); UCX will not see {name}");
        }
    }
    let sysfs = format!("/sys/class/net/{ifname}");
    copy_c_string(&mut c.dev_path, &sysfs);
    copy_c_string(&mut c.ibdev_path, &sysfs);
    let entry = Box::into_raw(Box::new(DeviceEntry {
        c,
        ifname: ifname.to_string(),
    }));
    known.insert(ifname.to_string(), RawObj::of(entry));
    entry
}

/// Where rdma-core's devices have their character devices (`uverbs0`, ...).
pub(crate) const DEVICE_NODE_DIR: &str = "/dev/infiniband";

/// Makes `dir/name` a character device a program may open for reading and writing, unless
/// something is there already.
///
/// `ibv_device::dev_name` names a node in /dev/infiniband, and some programs check that it
/// is there before they use a device (UCX `stat()`s and `access()`es it and skips the
/// device otherwise). xroce's library needs no kernel device, so the node is /dev/null's
/// twin (same major and minor): opening it is harmless, and reads and writes go nowhere.
pub(crate) fn ensure_device_node(dir: &Path, name: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let node = dir.join(name);
    if let Ok(meta) = std::fs::symlink_metadata(&node) {
        return if meta.file_type().is_char_device() {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "something that is not a character device is there",
            ))
        };
    }
    std::fs::create_dir_all(dir)?;
    let null = std::fs::metadata("/dev/null")?;
    let path = std::ffi::CString::new(node.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // Safety: `path` is a NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, null.rdev()) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        // Another process of the job made it meanwhile.
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            return Ok(());
        }
        return Err(e);
    }
    // mknod's mode is cut by the umask; every user may use the device, as with uverbs.
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666))
}

/// Whether an interface can carry RoCE: Ethernet, not loopback.
fn offerable(info: &NetdevInfo) -> bool {
    info.link_type == "ether"
}

/// The interfaces to offer, in a stable order.
pub(crate) fn interfaces() -> Vec<String> {
    let config = LibraryConfig::get();
    match &config.netdevs {
        Some(names) => names
            .iter()
            .filter(|name| match netdev::query(name) {
                Ok(info) if offerable(&info) => true,
                Ok(info) => {
                    if !config.quiet {
                        eprintln!(
                            "xroce: XROCE_NETDEV names {name}, which is not an Ethernet \
                             interface ({}); not offered",
                            info.link_type
                        );
                    }
                    false
                }
                Err(e) => {
                    if !config.quiet {
                        eprintln!("xroce: XROCE_NETDEV names {name}: {e}; not offered");
                    }
                    false
                }
            })
            .cloned()
            .collect(),
        None => {
            let mut names: Vec<String> = netdev::list()
                .unwrap_or_default()
                .into_iter()
                .filter(|name| {
                    netdev::query(name).is_ok_and(|info| offerable(&info) && info.admin_up)
                })
                .collect();
            names.sort();
            names
        }
    }
}

/// The interface a device pointer stands for.
///
/// # Safety
/// `device` must be a pointer this library handed out (or null).
pub(crate) unsafe fn ifname_of(device: *mut ibv_device) -> Option<String> {
    if device.is_null() {
        return None;
    }
    let known = lock(known());
    known
        .values()
        .any(|raw| raw.ptr::<ibv_device>() == device)
        // Safety: the pointer is one of ours (checked above), and entries are never freed.
        .then(|| unsafe { (*(device as *mut DeviceEntry)).ifname.clone() })
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_get_device_list`: a null-terminated array of the devices.
    pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
        let names = interfaces();
        let mut list: Vec<*mut ibv_device> = names
            .iter()
            .map(|name| entry_for(name) as *mut ibv_device)
            .collect();
        if !num_devices.is_null() {
            // Safety: the caller passes a valid int pointer or null (checked).
            unsafe { *num_devices = list.len() as c_int };
        }
        if list.is_empty() {
            // rdma-core: an empty list, with errno saying why none is there.
            set_errno(libc::ENODEV);
        }
        list.push(std::ptr::null_mut());
        let boxed = list.into_boxed_slice();
        // The length is recovered by ibv_free_device_list from the null terminator.
        Box::into_raw(boxed) as *mut *mut ibv_device
    }

    /// `ibv_free_device_list`.
    pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
        if list.is_null() {
            return;
        }
        let mut len = 0;
        // Safety: the list is one ibv_get_device_list returned: null-terminated.
        while !unsafe { *list.add(len) }.is_null() {
            len += 1;
        }
        // Safety: it was a boxed slice of len + 1 pointers.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, len + 1)) });
    }

    /// `ibv_get_device_name`.
    pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
        if device.is_null() {
            return std::ptr::null();
        }
        // Safety: a device pointer of ours; its name is NUL-terminated.
        unsafe { (*device).name.as_ptr() }
    }

    /// `ibv_get_device_guid`: the node GUID (modified EUI-64 of the MAC), network order.
    pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
        // Safety: as for ibv_get_device_name.
        let Some(ifname) = (unsafe { ifname_of(device) }) else {
            return 0;
        };
        match netdev::query(&ifname) {
            Ok(info) => xroce::verbs::attr::node_guid(info.mac).to_be(),
            Err(_) => 0,
        }
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.9";
    /// `ibv_get_device_index`: the interface index (unique, stable while it exists).
    pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
        // Safety: as for ibv_get_device_name.
        let Some(ifname) = (unsafe { ifname_of(device) }) else {
            return -1;
        };
        netdev::query(&ifname).map_or(-1, |info| info.ifindex as c_int)
    }
}

/// The device name of an entry, for messages.
///
/// # Safety
/// `device` must be a device pointer of this library.
pub(crate) unsafe fn device_name(device: *mut ibv_device) -> String {
    // Safety: per the contract; the name is NUL-terminated.
    unsafe { CStr::from_ptr((*device).name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    use super::ensure_device_node;

    fn may_mknod() -> bool {
        // Safety: geteuid has no arguments and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            let why = "making a character device needs root";
            assert!(std::env::var("XROCE_CI").as_deref() != Ok("1"), "{why}");
            eprintln!("SKIPPED: device node test: {why}");
        }
        root
    }

    #[test]
    fn a_device_node_is_a_read_write_character_device() {
        if !may_mknod() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let infiniband = dir.path().join("infiniband");
        ensure_device_node(&infiniband, "xroce_veth0").unwrap();
        let node = infiniband.join("xroce_veth0");
        let meta = std::fs::metadata(&node).unwrap();
        assert!(meta.file_type().is_char_device());
        assert_eq!(meta.permissions().mode() & 0o777, 0o666);
        // What UCX asks: access(R_OK | W_OK).
        let path = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
        // Safety: a NUL-terminated path.
        assert_eq!(
            unsafe { libc::access(path.as_ptr(), libc::R_OK | libc::W_OK) },
            0
        );
        // Twice is fine (another process of the job made it).
        ensure_device_node(&infiniband, "xroce_veth0").unwrap();
    }

    #[test]
    fn a_file_in_the_way_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("xroce_eth0"), b"keep").unwrap();
        let e = ensure_device_node(dir.path(), "xroce_eth0").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(
            std::fs::read(dir.path().join("xroce_eth0")).unwrap(),
            b"keep"
        );
    }
}
