//! The process's CM and devices: one [`Cm`] per process, devices opened lazily and
//! shared by every id on them with one PD each, as librdmacm does.
#![allow(clippy::missing_safety_doc)]
use super::*;

/// A device as librdmacm shares it: one context and one PD per interface, for the process.
pub(super) struct SharedDevice {
    pub(super) ctx: RawObj,
    pub(super) pd: RawObj,
}

pub(super) fn shared_devices() -> &'static Mutex<HashMap<String, SharedDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<String, SharedDevice>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The shared context (opened with its device) and PD of interface `ifname`.
pub(super) fn shared_device(ifname: &str) -> Result<(*mut ibv_context, *mut ibv_pd), RdmaCmError> {
    let mut all = lock(shared_devices());
    if let Some(d) = all.get(ifname) {
        return Ok((d.ctx.ptr(), d.pd.ptr()));
    }
    let entry = crate::capi::device_list::entry_for(ifname);
    // Safety: entry is a device of this library, alive for the process.
    let ctx = unsafe { crate::capi::context::ibv_open_device(entry as *mut _) };
    if ctx.is_null() {
        return Err(RdmaCmError::Io(std::io::Error::last_os_error()));
    }
    // Safety: just opened.
    if let Err(e) = unsafe { Context::from_c(ctx) }.device() {
        // Safety: ours, unused.
        unsafe { crate::capi::context::ibv_close_device(ctx) };
        return Err(e.into());
    }
    // Safety: an open context.
    let pd = unsafe { resources::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(RdmaCmError::Io(std::io::Error::last_os_error()));
    }
    all.insert(
        ifname.to_string(),
        SharedDevice {
            ctx: RawObj::of(ctx),
            pd: RawObj::of(pd),
        },
    );
    Ok((ctx, pd))
}

/// The interface (offered by this library) that has address `ip`.
pub(super) fn interface_with(ip: IpAddr) -> Option<String> {
    let gid = Gid::from_ip(ip);
    crate::capi::device_list::interfaces()
        .into_iter()
        .find(|name| {
            xroce::netdev::query(name)
                .is_ok_and(|info| info.gid_table().iter().any(|e| e.gid == gid))
        })
}

/// The device for `ip`; for a loopback address the first interface offered (see
/// `CmShared::port_for_local`).
pub(super) fn open_for(ip: IpAddr) -> Result<Option<Device>, RdmaCmError> {
    let ifname = if ip.is_loopback() {
        crate::capi::device_list::interfaces().into_iter().next()
    } else {
        interface_with(ip)
    };
    let Some(ifname) = ifname else {
        return Ok(None);
    };
    let (ctx, _) = shared_device(&ifname)?;
    // Safety: a shared context stays open for the process.
    let device = unsafe { Context::from_c(ctx) }.device()?.clone();
    Ok(Some(device))
}

/// Serves every device (an id bound to the unspecified address listens on all of them).
pub(super) fn open_all(cm: &Cm) {
    for name in crate::capi::device_list::interfaces() {
        let device = shared_device(&name).and_then(|(ctx, _)| {
            // Safety: a shared context stays open for the process.
            Ok(unsafe { Context::from_c(ctx) }.device()?.clone())
        });
        match device.and_then(|d| cm.add_device(&d)) {
            Ok(_) => {}
            Err(e) => {
                fail("rdma_listen", &e);
            }
        }
    }
}

/// The process's CM, made at the first call that needs it.
pub(super) fn cm() -> Result<&'static Cm, RdmaCmError> {
    static CM: OnceLock<Result<Cm, String>> = OnceLock::new();
    let made = CM.get_or_init(|| {
        Cm::with_config(&[], CmConfigRdma::default(), Some(Box::new(open_for)))
            .map_err(|e| e.to_string())
    });
    made.as_ref()
        .map_err(|e| RdmaCmError::InvalidArgument(format!("the RDMA CM did not start: {e}")))
}
