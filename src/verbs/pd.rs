//! Protection domains, memory regions and address handles.
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::dma::UserMemory;
use crate::engine::{
    check_mr_access, Access, AddressVector, MrChange, MrInfo, MrMemory, MwId, MwInfo, MwType, PdId,
    Sge,
};
use crate::wire::addr::Gid;

use super::attr::limits;
use super::device::{Core, Device, ObjectKind, ObjectSlot};
use super::error::{Result, VerbsError};
use super::qp::{Qp, QpInitAttr};
use super::runtime::Polled;

pub(crate) struct PdInner {
    pub core: Arc<Core>,
    pub id: PdId,
    _slot: ObjectSlot,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Every MR, QP and AH holds this PD alive, so nothing uses it any more.
        let _ = self
            .core
            .runtime
            .with_engine(0, false, |e| e.dealloc_pd(self.id));
    }
}

/// A protection domain (`ibv_pd`): memory regions and queue pairs of one PD may be used
/// together; a remote access through a QP to an MR of another PD fails.
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pd").field(&self.inner.id).finish()
    }
}

impl Pd {
    pub(crate) fn alloc(device: &Device) -> Result<Pd> {
        let slot = ObjectSlot::take(&device.core, ObjectKind::Pd)?;
        let id = device.shared().with_engine(0, false, |e| e.alloc_pd())?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                core: device.core.clone(),
                id,
                _slot: slot,
            }),
        })
    }

    /// The PD's id.
    pub fn id(&self) -> PdId {
        self.inner.id
    }

    /// Registers a new, zeroed memory region of `len` bytes (`ibv_reg_mr`). The device
    /// owns the bytes (the transport reads and writes them without copies through the
    /// application); reach them with [`Mr::read`] and [`Mr::write`]. The region lives as
    /// long as the returned handle (or a clone of it).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<Mr> {
        self.register(MrMemory::Device(len), access, None)
    }

    /// Registers a memory region on the application's own memory (`ibv_reg_mr` on a
    /// buffer of the caller's): the transport reads and writes those bytes in place, no
    /// copy. A remote WRITE lands in them, a SEND takes its bytes from them as they are
    /// when it goes out (so, as with any RDMA buffer, leave them alone from the post to the
    /// completion). Reach them through the memory itself ([`UserMemory::with_bytes`]) or
    /// through [`Mr::read`]/[`Mr::write`]; both are ordered with the device's accesses.
    /// After the last handle of the region is dropped the device never touches the memory
    /// again.
    pub fn reg_user_mr(&self, memory: UserMemory, access: Access) -> Result<Mr> {
        self.register(MrMemory::User(memory), access, None)
    }

    /// [`Pd::reg_user_mr`] with the region at `iova` in its keys' address space, as
    /// `ibv_reg_mr` places a region at the buffer's virtual address (and
    /// `ibv_reg_mr_iova2` anywhere): [`Mr::addr`] is `iova`, and work requests address the
    /// region's bytes as `iova ..= iova + len - 1`. Regions placed so may overlap (the same
    /// buffer registered twice); an access names its region by key.
    pub fn reg_user_mr_at(&self, memory: UserMemory, access: Access, iova: u64) -> Result<Mr> {
        self.register(MrMemory::User(memory), access, Some(iova))
    }

    fn register(&self, memory: MrMemory, access: Access, iova: Option<u64>) -> Result<Mr> {
        check_mr_memory(&memory)?;
        // ibv_reg_mr(3), IBTA 10.6.3.1: remote write or atomic access needs local write.
        check_mr_access(access)?;
        let slot = ObjectSlot::take(&self.inner.core, ObjectKind::Mr)?;
        let user = match &memory {
            MrMemory::User(m) => Some(m.clone()),
            MrMemory::Device(_) => None,
        };
        let info = self
            .inner
            .core
            .runtime
            .with_engine(0, false, |e| match memory {
                MrMemory::Device(len) => e.reg_mr(self.inner.id, len, access),
                MrMemory::User(m) => match iova {
                    Some(iova) => e.reg_user_mr_at(self.inner.id, m, access, iova),
                    None => e.reg_user_mr(self.inner.id, m, access),
                },
            })??;
        Ok(Mr {
            inner: Arc::new(MrInner {
                core: self.inner.core.clone(),
                state: ArcSwap::from_pointee(MrState {
                    pd: self.inner.clone(),
                    info,
                    user,
                }),
                rereg: Mutex::new(()),
                _slot: slot,
            }),
        })
    }

    /// Allocates a memory window (`ibv_alloc_mw`, IBTA 10.6.7.1). A type 1 window is bound
    /// with [`super::Qp::bind_mw`]; a type 2 window by posting a
    /// [`WrOp::BindMw`](crate::engine::WrOp::BindMw) on the QP it is to serve, and freed
    /// again by a LOCAL_INV or a peer's SEND_WITH_INV. The window lives as long as the
    /// handle (or a clone); the regions it is bound to cannot be deregistered meanwhile.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        let slot = ObjectSlot::take(&self.inner.core, ObjectKind::Mw)?;
        let info = self
            .inner
            .core
            .runtime
            .with_engine(0, false, |e| e.alloc_mw(self.inner.id, mw_type))??;
        Ok(Mw {
            inner: Arc::new(MwInner {
                pd: self.inner.clone(),
                id: info.id,
                mw_type,
                _slot: slot,
            }),
        })
    }

    /// Registers a region holding a copy of `data`.
    pub fn reg_mr_with(&self, data: &[u8], access: Access) -> Result<Mr> {
        let mr = self.reg_mr(data.len(), access)?;
        mr.write(0, data)?;
        Ok(mr)
    }

    /// Creates a queue pair (`ibv_create_qp`); see [`QpInitAttr`].
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        Qp::create(self, init)
    }

    /// Creates an address handle for UD sends (`ibv_create_ah`): resolves the destination
    /// GID's MAC through the neighbour table (which may take up to the device's
    /// neighbour timeout).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        let slot = ObjectSlot::take(&self.inner.core, ObjectKind::Ah)?;
        let device = Device {
            core: self.inner.core.clone(),
        };
        let av = device.resolve_av(attr)?;
        Ok(AddressHandle {
            av,
            _pd: self.inner.clone(),
            _slot: Arc::new(slot),
        })
    }
}

pub(crate) struct MwInner {
    pub pd: Arc<PdInner>,
    id: MwId,
    mw_type: MwType,
    _slot: ObjectSlot,
}

impl Drop for MwInner {
    fn drop(&mut self) {
        let id = self.id;
        let _ = self
            .pd
            .core
            .runtime
            .with_engine(0, false, |e| e.dealloc_mw(id));
    }
}

/// A memory window (`ibv_mw`): a remote-access view of part of a region, with its own R_Key
/// and rights, bound and invalidated without re-registering the region (IBTA 10.6.7).
#[derive(Clone)]
pub struct Mw {
    pub(crate) inner: Arc<MwInner>,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("id", &self.inner.id)
            .field("type", &self.inner.mw_type)
            .finish()
    }
}

impl Mw {
    /// The handle a [`WrOp::BindMw`](crate::engine::WrOp::BindMw) names.
    pub fn id(&self) -> MwId {
        self.inner.id
    }

    /// Type 1 or 2.
    pub fn mw_type(&self) -> MwType {
        self.inner.mw_type
    }

    /// The R_Key, binding and QP in force (a bind posted but not executed yet is not).
    pub fn query(&self) -> Result<MwInfo> {
        let id = self.inner.id;
        Ok(self
            .inner
            .pd
            .core
            .runtime
            .with_engine(0, false, |e| e.query_mw(id))??)
    }

    /// The R_Key in force: what a peer puts in its RETH or AtomicETH.
    pub fn rkey(&self) -> Result<u32> {
        Ok(self.query()?.rkey)
    }
}

/// The memory a region may be (re-)registered on: not empty, not over `max_mr_size`.
fn check_mr_memory(memory: &MrMemory) -> Result<()> {
    let len = memory.len();
    if len == 0 {
        return Err(VerbsError::Zero { what: "MR length" });
    }
    if len as u64 > limits::MAX_MR_SIZE {
        return Err(VerbsError::LimitExceeded {
            what: "max_mr_size",
            requested: len as u64,
            max: limits::MAX_MR_SIZE,
        });
    }
    Ok(())
}

pub(crate) struct MrInner {
    core: Arc<Core>,
    /// What the region is now; a re-registration publishes a new one.
    state: ArcSwap<MrState>,
    /// Held by a re-registration, so two of them publish in the engine's order.
    rereg: Mutex<()>,
    _slot: ObjectSlot,
}

struct MrState {
    /// Kept alive while the region belongs to it.
    pd: Arc<PdInner>,
    info: MrInfo,
    /// The application's memory, for a region registered on it.
    user: Option<UserMemory>,
}

impl Drop for MrInner {
    fn drop(&mut self) {
        let lkey = self.state.load().info.lkey;
        let _ = self.core.runtime.transmit_all_waiting();
        let _ = self
            .core
            .runtime
            .with_engine(0, false, |e| e.dereg_mr(lkey));
    }
}

/// A registered memory region (`ibv_mr`). Its bytes are the device's ([`Pd::reg_mr`]) or
/// the application's ([`Pd::reg_user_mr`]); either way no use-after-free is possible: a WR
/// naming a deregistered region fails with a protection error instead of touching memory
/// that may be freed.
#[derive(Clone)]
pub struct Mr {
    inner: Arc<MrInner>,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.state.load();
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", state.info.addr))
            .field("len", &state.info.length)
            .field("lkey", &format_args!("{:#x}", state.info.lkey))
            .field("user_memory", &state.user.is_some())
            .finish()
    }
}

/// What [`Mr::rereg`] changes (`ibv_rereg_mr`'s `IBV_REREG_MR_CHANGE_TRANSLATION`, `_PD`,
/// `_ACCESS`); `None` keeps it. At least one must be given.
#[derive(Clone, Debug, Default)]
pub struct MrRereg<'a> {
    /// New memory: the device's zeroed bytes or the application's. The region gets a new
    /// [`Mr::addr`] for it; the old memory is not reached again once `rereg` returns.
    pub memory: Option<MrMemory>,
    /// The protection domain the region moves to (of the same device).
    pub pd: Option<&'a Pd>,
    /// The new access rights (the same rules as at registration).
    pub access: Option<Access>,
}

impl Mr {
    fn info(&self) -> MrInfo {
        self.inner.state.load().info
    }

    /// Start address in the device's address space (what the peer puts in a RETH).
    pub fn addr(&self) -> u64 {
        self.info().addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.info().length
    }

    /// Always false: zero-length regions cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.info().length == 0
    }

    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.info().lkey
    }

    /// Remote key, for the peer's RDMA READ/WRITE/atomics.
    pub fn rkey(&self) -> u32 {
        self.info().rkey
    }

    /// Access flags.
    pub fn access(&self) -> Access {
        self.info().access
    }

    /// The PD it belongs to.
    pub fn pd(&self) -> PdId {
        self.info().pd
    }

    /// The application's memory the region is registered on; `None` when its bytes are
    /// the device's.
    pub fn user_memory(&self) -> Option<UserMemory> {
        self.inner.state.load().user.clone()
    }

    /// Re-registers the region (`ibv_rereg_mr`): other memory, another PD, other access
    /// rights, or several at once; the keys stay. A refused change (nothing to change, a PD
    /// of another device, access against the rules, an empty or oversized memory) leaves
    /// the region as it was. Like `ibv_rereg_mr`, it is for a region no operation is using:
    /// one the device checked before the call may still complete against the old rights.
    pub fn rereg(&self, change: &MrRereg<'_>) -> Result<()> {
        self.rereg_at(change, None)
    }

    /// [`Mr::rereg`] with new memory placed at `iova` in the key's address space (as
    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_TRANSLATION` places it at the new buffer's
    /// virtual address); `None`: a fresh range.
    pub fn rereg_at(&self, change: &MrRereg<'_>, iova: Option<u64>) -> Result<()> {
        if let Some(pd) = change.pd {
            if !Arc::ptr_eq(&pd.inner.core, &self.inner.core) {
                return Err(VerbsError::WrongDevice {
                    what: "protection domain",
                });
            }
        }
        if let Some(memory) = &change.memory {
            check_mr_memory(memory)?;
        }
        if let Some(access) = change.access {
            check_mr_access(access)?;
        }
        let _one_at_a_time = self.inner.rereg.lock().unwrap_or_else(|p| p.into_inner());
        let state = self.inner.state.load_full();
        let engine_change = MrChange {
            memory: change.memory.clone(),
            pd: change.pd.map(|p| p.inner.id),
            access: change.access,
        };
        let lkey = state.info.lkey;
        self.inner.core.runtime.transmit_all_waiting()?;
        let info = self
            .inner
            .core
            .runtime
            .with_engine(0, false, |e| e.rereg_mr_at(lkey, engine_change, iova))??;
        let user = match &change.memory {
            Some(MrMemory::User(m)) => Some(m.clone()),
            Some(MrMemory::Device(_)) => None,
            None => state.user.clone(),
        };
        self.inner.state.store(Arc::new(MrState {
            pd: change
                .pd
                .map_or_else(|| state.pd.clone(), |p| p.inner.clone()),
            info,
            user,
        }));
        Ok(())
    }

    /// How many memory windows are bound to the region now: while any are, dropping the
    /// last handle does not deregister it (the windows keep it), and `ibv_dereg_mr` says
    /// `EBUSY`.
    pub fn bound_windows(&self) -> Result<u32> {
        let lkey = self.info().lkey;
        self.inner
            .core
            .runtime
            .with_engine(0, false, |e| e.mr_bound_windows(lkey))
    }

    /// The address of `len` bytes at `offset`, and the key, of one view of the region (a
    /// re-registration may move it meanwhile).
    fn check(&self, offset: usize, len: usize) -> Result<(u64, u32)> {
        let info = self.info();
        match offset.checked_add(len) {
            Some(end) if end <= info.length => Ok((info.addr + offset as u64, info.lkey)),
            _ => Err(VerbsError::MrRange {
                offset: offset as u64,
                len: len as u64,
                mr_len: info.length as u64,
            }),
        }
    }

    /// An SGE for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        let (addr, lkey) = self.check(offset, len as usize)?;
        Ok(Sge {
            addr,
            length: len,
            lkey,
        })
    }

    /// An SGE covering the whole region.
    pub fn sge_all(&self) -> Sge {
        let info = self.info();
        Sge {
            addr: info.addr,
            length: info.length.min(u32::MAX as usize) as u32,
            lkey: info.lkey,
        }
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    ///
    /// Reading is how a program polls memory for a peer's RDMA WRITE (as `ib_write_lat`
    /// does), so, like polling a CQ, it first makes progress when no other thread is.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let (addr, lkey) = self.check(offset, out.len())?;
        let shared = &self.inner.core.runtime;
        shared.hold_lease();
        Ok(
            shared.poll_shards(shared_all(&self.inner.core), 0, Polled::Memory, |e| {
                e.mr_read(lkey, addr, out)
            })??,
        )
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let (addr, lkey) = self.check(offset, data.len())?;
        Ok(self
            .inner
            .core
            .runtime
            .with_engine(0, false, |e| e.mr_write(lkey, addr, data))??)
    }

    /// A copy of `len` bytes at `offset`.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0; len];
        self.read(offset, &mut out)?;
        Ok(out)
    }

    /// The 64-bit value at `offset` in host byte order (atomics operate on such values;
    /// the wire carries them big-endian and the engine converts).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Stores a 64-bit value at `offset` in host byte order.
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.write(offset, &value.to_ne_bytes())
    }
}

/// Every shard of the device: any of them may write a region (a peer's WRITE arrives on
/// the shard of its QP), so a thread polling memory drives them all.
fn shared_all(core: &Core) -> u64 {
    core.runtime.all_shards()
}

/// Where to send: the destination of an address handle or of a connected QP (`ibv_ah_attr`
/// with its GRH; RoCE always has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// The destination GID (its IP address).
    pub dgid: Gid,
    /// Index of the source GID in the local table (selects IPv4 or IPv6 and the source).
    pub sgid_index: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
}

impl AhAttr {
    /// Defaults for a destination: hop limit 64, traffic class 0, flow label 0.
    pub fn new(dgid: Gid, sgid_index: u8) -> AhAttr {
        AhAttr {
            dgid,
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

impl Device {
    /// Turns an [`AhAttr`] into the engine's address vector: checks the source GID index
    /// and family, and resolves the destination MAC. Use it for RC QPs (`QpAttr::ah_attr`).
    pub fn resolve_av(&self, attr: &AhAttr) -> Result<AddressVector> {
        let sgid = self.query_gid(attr.sgid_index as u32)?;
        if let Some(src) = self.core.runtime.udp_source {
            if sgid.to_ip() != src {
                let usable = self
                    .gid_table()
                    .iter()
                    .find(|e| e.gid.to_ip() == src)
                    .map_or(String::new(), |e| format!("use GID index {} or ", e.index));
                return Err(VerbsError::InvalidArgument(format!(
                    "source GID {sgid} (index {}) cannot be used: the UDP driver sends only from \
                     its bound address {src}; {usable}open the device with udp_local_ip = {}",
                    attr.sgid_index,
                    sgid.to_ip()
                )));
            }
        }
        if sgid.is_ipv4() != attr.dgid.is_ipv4() {
            return Err(VerbsError::InvalidArgument(format!(
                "source GID {} (index {}) and destination GID {} are not the same IP family",
                sgid, attr.sgid_index, attr.dgid
            )));
        }
        let ip = attr.dgid.to_ip();
        // Check the fields the caller chose before resolving (which may wait for ARP); the
        // MAC is checked again once known.
        let gids: Vec<_> = self.gid_table().iter().map(|e| e.gid.to_ip()).collect();
        let mut av = AddressVector::new([2, 0, 0, 0, 0, 0], ip);
        av.sgid_index = attr.sgid_index;
        av.hop_limit = attr.hop_limit;
        av.traffic_class = attr.traffic_class;
        av.flow_label = attr.flow_label;
        let port_mac = self.netdev().mac.0;
        av.validate(&gids, port_mac)?;
        av.dest_mac = self.resolve_mac(ip)?.0;
        av.validate(&gids, port_mac)?;
        Ok(av)
    }
}

/// An address handle (`ibv_ah`): a resolved destination for UD sends.
#[derive(Clone)]
pub struct AddressHandle {
    av: AddressVector,
    _pd: Arc<PdInner>,
    _slot: Arc<ObjectSlot>,
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AddressHandle").field(&self.av).finish()
    }
}

impl AddressHandle {
    /// The resolved address vector (destination MAC and IP, source GID index, hop limit).
    pub fn av(&self) -> AddressVector {
        self.av
    }
}
