//! Memory regions: each MR's bytes are either the engine's own (a `Vec<u8>`) or the
//! application's (a [`UserMemory`] of the DMA layer, read and written in place); either way
//! the transport reaches them without `unsafe` here, through the storage's safe methods, and
//! the verbs layer through `Engine::mr_read` / `mr_write`. Every region sits at an iova the
//! table hands out, whatever its storage.
//!
//! The table is shared by the engine shards of one device ([`super::Engine::new_shards`]):
//! any shard's responder may write a region another shard's requester reads. It is a
//! [`SharedTable`]: each shard reads its cached snapshot (no shared lock: cores reading it
//! do not contend for a cache line); registering, re-registering and deregistering publish a
//! new copy.
//! Each region's bytes are behind their own lock, held for one copy: shards working on
//! different regions never wait for each other, as on an HCA whose DMA engines work in
//! parallel.
//!
//! Keys are `index << 8 | tag`: the low byte changes each time a slot is reused, so a stale
//! key of a deregistered MR does not match its successor (IBTA 10.6.3, the "key" portion).
//!
//! Memory windows (IBTA 10.6.7) live in the same slots, so one R_Key space names both and
//! every shard sees a window bound on any other. A window's binding (its current R_Key, the
//! MR range and rights) sits behind the window's own mutex, held across the check *and* the
//! copy of every remote access through it: once a bind or an invalidation returns, no access
//! under the old binding is still running anywhere (the memory behind an invalidated
//! window is never touched again).
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::shared_table::{SharedTable, Snapshot};

use super::types::{Access, MwBindInfo, MwId, MwType, PdId, Sge};
use crate::dma::UserMemory;

/// One registered memory region.
#[derive(Debug)]
pub(crate) struct Mr {
    pub pd: PdId,
    pub key: u32,
    pub iova: u64,
    pub access: Access,
    pub len: usize,
    /// False after a remote SEND_WITH_INV or a LOCAL_INV invalidated the R_Key.
    pub rkey_valid: AtomicBool,
    /// Memory windows bound to the region: it cannot be deregistered (nor re-registered)
    /// while any is (IBTA 10.6.7: a region with bound windows is not deregistered).
    windows: AtomicU32,
    /// Shared by the versions of the region a re-registration that keeps the translation
    /// publishes.
    data: Arc<MrBytes>,
}

/// Where a region's bytes are.
#[derive(Debug)]
enum MrBytes {
    /// The engine's own.
    Device(Mutex<Vec<u8>>),
    /// The application's, under the memory's own lock. `live` turns false (under that lock)
    /// when the region is deregistered or moved elsewhere: from then on no access reaches
    /// the memory, not even one whose key check passed before, so the caller may free it.
    User {
        memory: UserMemory,
        live: AtomicBool,
    },
}

impl MrBytes {
    /// Runs `f` on the bytes `range`, under their lock; `None` if the range is outside them
    /// or the application's memory is no longer the region's.
    fn with<R>(&self, range: std::ops::Range<usize>, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        match self {
            MrBytes::Device(bytes) => {
                // A copy that panicked half-way leaves bytes, not a broken invariant.
                let mut bytes = bytes.lock().unwrap_or_else(|p| p.into_inner());
                bytes.get_mut(range).map(f)
            }
            MrBytes::User { memory, live } => memory.with_bytes(|bytes| {
                if !live.load(Ordering::Acquire) {
                    return None;
                }
                bytes.get_mut(range).map(f)
            }),
        }
    }

    /// The region is gone from the table: no later access may reach the bytes. Taking the
    /// memory's lock waits for an access under way to end.
    fn retire(&self) {
        if let MrBytes::User { memory, live } = self {
            memory.with_bytes(|_| live.store(false, Ordering::Release));
        }
    }

    fn user(&self) -> Option<&UserMemory> {
        match self {
            MrBytes::User { memory, .. } => Some(memory),
            MrBytes::Device(_) => None,
        }
    }
}

/// The byte range of `[addr, addr+len)` inside a region at `iova` of `size` bytes, if it is
/// in bounds.
fn range_in(iova: u64, size: usize, addr: u64, len: u64) -> Option<std::ops::Range<usize>> {
    let start = addr.checked_sub(iova)?;
    let end = start.checked_add(len)?;
    if end > size as u64 {
        return None;
    }
    Some(start as usize..end as usize)
}

impl Mr {
    /// The byte range of `[addr, addr+len)` inside the region, if it is in bounds.
    pub fn range(&self, addr: u64, len: u64) -> Option<std::ops::Range<usize>> {
        range_in(self.iova, self.len, addr, len)
    }

    /// Runs `f` on the bytes `[addr, addr+len)`; `None` if out of bounds or gone.
    fn with_range<R>(&self, addr: u64, len: u64, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let r = self.range(addr, len)?;
        self.data.with(r, f)
    }
}

/// The bytes a region is registered on: the engine's (zeroed) or the application's.
#[derive(Clone, Debug)]
pub enum MrMemory {
    /// This many zeroed bytes the engine owns (`Engine::reg_mr`).
    Device(usize),
    /// The application's memory, read and written in place.
    User(UserMemory),
}

impl MrMemory {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            MrMemory::Device(len) => *len,
            MrMemory::User(memory) => memory.len(),
        }
    }

    /// Whether it has no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn into_bytes(self) -> MrBytes {
        match self {
            MrMemory::Device(len) => MrBytes::Device(Mutex::new(vec![0; len])),
            MrMemory::User(memory) => MrBytes::User {
                memory,
                live: AtomicBool::new(true),
            },
        }
    }
}

/// What a re-registration changes (`ibv_rereg_mr`'s `IBV_REREG_MR_CHANGE_*`); `None` keeps
/// it. Checked by the caller (PD exists, access rules).
#[derive(Debug, Default)]
pub(crate) struct MrUpdate {
    pub memory: Option<MrMemory>,
    /// Where new memory sits in the iova space; `None`: a fresh range.
    pub iova: Option<u64>,
    pub pd: Option<PdId>,
    pub access: Option<Access>,
}

/// Why a re-registration was refused (the region is unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReregFault {
    /// No region with that key.
    NoSuchRegion,
    /// Memory windows are bound to the region.
    WindowsBound,
    /// No iova range left for the new memory.
    IovaSpaceUsedUp,
}

/// What a caller may know of a region without touching its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrFacts {
    pub pd: PdId,
    pub key: u32,
    pub iova: u64,
    pub access: Access,
    pub len: usize,
    pub rkey_valid: bool,
}

/// Why a remote or local memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AccessFault {
    /// No MR with this key (or a stale key, or an invalidated R_Key).
    BadKey,
    /// The MR belongs to another PD than the QP.
    WrongPd,
    /// The MR (or QP) does not grant the access.
    NoPermission,
    /// The range is outside the MR (or the window).
    OutOfBounds,
    /// A type 2 window serves only the QP that bound it.
    WrongQp,
}

/// One allocated memory window.
#[derive(Debug)]
pub(crate) struct Mw {
    pub pd: PdId,
    pub mw_type: MwType,
    /// The index part of every R_Key the window takes.
    pub id: MwId,
    state: Mutex<MwState>,
}

#[derive(Debug)]
struct MwState {
    /// The R_Key in force.
    rkey: u32,
    /// The R_Key of the last type 1 bind posted (it takes effect when executed).
    posted_rkey: u32,
    /// `None`: a type 2 window is free (IBTA's "Free" state); a type 1 window covers nothing.
    binding: Option<MwBinding>,
}

#[derive(Debug)]
struct MwBinding {
    mr: Arc<Mr>,
    addr: u64,
    len: u64,
    access: Access,
    /// Type 2: the QP that bound it, the only one it serves (IBTA 10.6.7.2.2, type 2B).
    qpn: Option<u32>,
}

impl Mw {
    fn state(&self) -> MutexGuard<'_, MwState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a caller may know of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MwFacts {
    pub pd: PdId,
    pub mw_type: MwType,
    pub rkey: u32,
    pub posted_rkey: u32,
    /// (MR lkey, address, length, rights, QP) of the binding in force.
    pub bound: Option<(u32, u64, u64, Access, Option<u32>)>,
}

/// Why a bind was refused (the bind WR completes with `MW_BIND_ERR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindFault {
    /// The window is gone, or the R_Key's index part is not the window's.
    NoSuchWindow,
    /// The QP, window and region are not all in one PD (IBTA 10.6.7.2, C10-72).
    WrongPd,
    /// A type 2 window is bound already: only a free one binds (o10-37.2.30).
    NotFree,
    /// A type 2 bind of length 0 (o10-37.2.40).
    ZeroLength,
    /// No such region.
    NoSuchMr,
    /// The region lacks MW_BIND (C10-73), or the window asks for remote write or atomic
    /// on a region without local write (C10-74).
    NoPermission,
    /// The window is not inside the region (C10-75).
    OutOfBounds,
}

/// A remote access: through `rkey`, on behalf of the QP `qpn` of PD `pd`, to `len` bytes at
/// `va`, needing `need`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RemoteAccess {
    pub rkey: u32,
    pub pd: PdId,
    pub qpn: u32,
    pub va: u64,
    pub len: u64,
    pub need: Access,
}

/// Registered MRs and allocated windows, indexed by key (shared by a device's engine shards).
/// Each shard has its own view (`clone`), with its own cached snapshot.
#[derive(Debug, Default, Clone)]
pub(crate) struct MrTable {
    slots: SharedTable<MrSlots>,
}

#[derive(Clone, Debug)]
enum Slot {
    Mr(MrSlot),
    Mw(Arc<Mw>),
}

/// A region's slot: besides the region, the fields every access checks, kept in the table
/// itself, so a check reads the slot and not also the region behind its `Arc` (the pointer
/// chase, not the lookup, is what a check costs). A region's fields never change in place: a
/// re-registration publishes a new region in a new slot.
#[derive(Clone, Debug)]
struct MrSlot {
    key: u32,
    pd: PdId,
    access: Access,
    iova: u64,
    len: usize,
    mr: Arc<Mr>,
}

impl MrSlot {
    fn new(mr: Mr) -> MrSlot {
        MrSlot {
            key: mr.key,
            pd: mr.pd,
            access: mr.access,
            iova: mr.iova,
            len: mr.len,
            mr: Arc::new(mr),
        }
    }

    fn range(&self, addr: u64, len: u64) -> Option<std::ops::Range<usize>> {
        range_in(self.iova, self.len, addr, len)
    }
}

#[derive(Clone, Debug, Default)]
struct MrSlots {
    slots: Vec<Option<Slot>>,
    tags: Vec<u8>,
    next_iova: u64,
}

impl MrSlots {
    fn get(&self, key: u32) -> Option<&Mr> {
        self.get_arc(key).map(|mr| &**mr)
    }

    /// The region `key` names, shared.
    fn get_arc(&self, key: u32) -> Option<&Arc<Mr>> {
        self.entry(key).map(|s| &s.mr)
    }

    /// The slot of the region `key` names.
    fn entry(&self, key: u32) -> Option<&MrSlot> {
        match self.slot(key)? {
            Slot::Mr(s) if s.key == key => Some(s),
            _ => None,
        }
    }

    /// The window whose index part `key` carries (its current R_Key is checked under its lock).
    fn window(&self, key: u32) -> Option<&Arc<Mw>> {
        match self.slot(key)? {
            Slot::Mw(mw) => Some(mw),
            Slot::Mr(_) => None,
        }
    }

    fn slot(&self, key: u32) -> Option<&Slot> {
        let idx = ((key >> 8) as usize).checked_sub(1)?;
        self.slots.get(idx)?.as_ref()
    }

    fn mrs(&self) -> impl Iterator<Item = &Arc<Mr>> {
        self.slots.iter().flatten().filter_map(|s| match s {
            Slot::Mr(s) => Some(&s.mr),
            Slot::Mw(_) => None,
        })
    }

    /// A free slot and the key it gets now (its tag moves on).
    fn take_slot(&mut self) -> Option<(usize, u32)> {
        let idx = match self.slots.iter().position(|s| s.is_none()) {
            Some(i) => i,
            // The index fills the key's upper 24 bits: no more objects than that.
            None if self.slots.len() + 1 >= 1 << 24 => return None,
            None => {
                self.slots.push(None);
                self.tags.push(0);
                self.slots.len() - 1
            }
        };
        self.tags[idx] = self.tags[idx].wrapping_add(0x35) | 1;
        Some((idx, ((idx as u32 + 1) << 8) | self.tags[idx] as u32))
    }
}

/// A window's binding checked for `a`: the byte range of its region, or why not.
fn window_range(
    mw: &Mw,
    st: &MwState,
    a: &RemoteAccess,
) -> Result<std::ops::Range<usize>, AccessFault> {
    // IBTA 9.7.4.1.5 / 10.6.7.2: the R_Key in force, the QP's PD, a type 2 window's own
    // QP, the window's rights and bounds.
    if st.rkey != a.rkey {
        return Err(AccessFault::BadKey);
    }
    let b = st.binding.as_ref().ok_or(AccessFault::BadKey)?;
    if mw.pd != a.pd {
        return Err(AccessFault::WrongPd);
    }
    if b.qpn.is_some_and(|q| q != a.qpn) {
        return Err(AccessFault::WrongQp);
    }
    if !b.access.contains(a.need) {
        return Err(AccessFault::NoPermission);
    }
    let start = a.va.checked_sub(b.addr).ok_or(AccessFault::OutOfBounds)?;
    let end = start.checked_add(a.len).ok_or(AccessFault::OutOfBounds)?;
    if end > b.len {
        return Err(AccessFault::OutOfBounds);
    }
    b.mr.range(a.va, a.len).ok_or(AccessFault::OutOfBounds)
}

/// A region's own R_Key checked for `a`: the byte range, or why not.
fn check_region(mr: &Mr, a: &RemoteAccess) -> Result<std::ops::Range<usize>, AccessFault> {
    if !mr.rkey_valid.load(Ordering::SeqCst) {
        return Err(AccessFault::BadKey);
    }
    if mr.pd != a.pd {
        return Err(AccessFault::WrongPd);
    }
    if !mr.access.contains(a.need) {
        return Err(AccessFault::NoPermission);
    }
    mr.range(a.va, a.len).ok_or(AccessFault::OutOfBounds)
}

/// Walks an SGE list from `offset` bytes in, for `len` bytes: `copy` gets each piece's
/// region, the piece's range in the region's bytes and its range in the caller's buffer, and
/// says whether it copied. False if the list holds fewer bytes, an lkey names no region, a
/// piece is out of its region's bounds, or `copy` did not copy (the memory is gone).
fn walk_sges(
    t: &MrSlots,
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut copy: impl FnMut(&MrSlot, Range<usize>, Range<usize>) -> Option<()>,
) -> bool {
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        if offset >= sge.length as u64 {
            offset -= sge.length as u64;
            continue;
        }
        let take = ((sge.length as u64 - offset) as usize).min(len - done);
        let Some(mr) = t.entry(sge.lkey) else {
            return false;
        };
        let copied = sge
            .addr
            .checked_add(offset)
            .and_then(|a| mr.range(a, take as u64))
            .and_then(|r| copy(mr, r, done..done + take));
        if copied.is_none() {
            return false;
        }
        done += take;
        offset = 0;
    }
    done == len
}

/// [`MrTable::scatter`] on a snapshot already read.
fn scatter_in(t: &MrSlots, sges: &[Sge], offset: u64, data: &[u8]) -> bool {
    walk_sges(t, sges, offset, data.len(), |mr, r, piece| {
        mr.mr.data.with(r, |b| b.copy_from_slice(&data[piece]))
    })
}

/// Base of the iova space handed out to MRs: far from zero so a null address never matches.
const IOVA_BASE: u64 = 0x0000_7f00_0000_0000;

impl MrTable {
    fn read(&self) -> Snapshot<'_, MrSlots> {
        self.slots.read()
    }

    /// Runs `change` on a copy of the table and publishes the copy.
    fn update<R>(&self, change: impl FnOnce(&mut MrSlots) -> R) -> R {
        self.slots.update(change)
    }

    /// Register `len` zeroed bytes; returns (key, iova), or `None` when the iova space is
    /// used up (never wrapped: two regions must not overlap). For unit tests.
    #[cfg(test)]
    pub fn register(&self, pd: PdId, len: usize, access: Access) -> Option<(u32, u64)> {
        self.register_on(pd, MrMemory::Device(len), access, None)
    }

    /// Register a region on `memory`; as [`MrTable::register`]. `iova`: where the region
    /// sits in the iova space the keys address, as `ibv_reg_mr` puts it at the application's
    /// virtual address (regions may then overlap: each access names its region by key);
    /// `None`: a fresh range that overlaps no other.
    pub fn register_on(
        &self,
        pd: PdId,
        memory: MrMemory,
        access: Access,
        iova: Option<u64>,
    ) -> Option<(u32, u64)> {
        self.update(|t| t.register(pd, memory, access, iova))
    }

    /// Re-register the region `key` (same key): a new PD or access applies to the next
    /// access checked, new memory gets a fresh iova and the old memory is never reached
    /// again once this returns. Returns the new iova, or `None` if there is no such region
    /// or no iova space left (the region is then unchanged).
    pub fn reregister(&self, key: u32, change: MrUpdate) -> Result<u64, ReregFault> {
        let retired = self.update(|t| {
            let old = t.get_arc(key).cloned().ok_or(ReregFault::NoSuchRegion)?;
            // Windows bound to the region hold this version of it: rdma-core's rereg
            // refuses then too (EBUSY), and a window never sees a region change under it.
            if old.windows.load(Ordering::SeqCst) > 0 {
                return Err(ReregFault::WindowsBound);
            }
            let idx = (key >> 8) as usize - 1;
            let (iova, len, data) = match change.memory {
                Some(memory) => {
                    let len = memory.len();
                    let iova = match change.iova {
                        Some(iova) => iova,
                        None => t.alloc_iova(len).ok_or(ReregFault::IovaSpaceUsedUp)?,
                    };
                    (iova, len, Arc::new(memory.into_bytes()))
                }
                None => (old.iova, old.len, old.data.clone()),
            };
            let moved = !Arc::ptr_eq(&data, &old.data);
            t.slots[idx] = Some(Slot::Mr(MrSlot::new(Mr {
                pd: change.pd.unwrap_or(old.pd),
                key,
                iova,
                access: change.access.unwrap_or(old.access),
                len,
                // A re-registration is a new registration (ibv_rereg_mr(3)): its R_Key works.
                rkey_valid: AtomicBool::new(true),
                windows: AtomicU32::new(0),
                data,
            })));
            Ok((iova, moved.then_some(old)))
        });
        let (iova, old) = retired?;
        if let Some(old) = old {
            old.data.retire();
        }
        Ok(iova)
    }

    /// How many memory windows are bound to the region `key` (0 if there is no such region).
    pub fn bound_windows(&self, key: u32) -> u32 {
        self.read()
            .get(key)
            .map_or(0, |mr| mr.windows.load(Ordering::SeqCst))
    }

    /// The application's memory the region `key` is registered on, if it is.
    pub fn user_memory(&self, key: u32) -> Option<UserMemory> {
        self.read().get(key)?.data.user().cloned()
    }
}

impl MrSlots {
    /// A fresh iova range for `len` bytes, page aligned with a guard page after it; `None`
    /// once the iova space is used up (never wrapped: two regions must not overlap).
    fn alloc_iova(&mut self, len: usize) -> Option<u64> {
        if self.next_iova == 0 {
            self.next_iova = IOVA_BASE;
        }
        let iova = self.next_iova;
        let next = (len as u64)
            .checked_add(4095)
            .map(|l| l & !4095)
            .and_then(|l| l.checked_add(4096))
            .and_then(|l| iova.checked_add(l))?;
        self.next_iova = next;
        Some(iova)
    }

    fn register(
        &mut self,
        pd: PdId,
        memory: MrMemory,
        access: Access,
        iova: Option<u64>,
    ) -> Option<(u32, u64)> {
        let t = self;
        let len = memory.len();
        let iova = match iova {
            Some(iova) => iova,
            None => t.alloc_iova(len)?,
        };
        let (idx, key) = t.take_slot()?;
        t.slots[idx] = Some(Slot::Mr(MrSlot::new(Mr {
            pd,
            key,
            iova,
            access,
            len,
            rkey_valid: AtomicBool::new(true),
            windows: AtomicU32::new(0),
            data: Arc::new(memory.into_bytes()),
        })));
        Some((key, iova))
    }
}

impl MrTable {
    /// The facts of the region `key`, if it exists.
    pub fn facts(&self, key: u32) -> Option<MrFacts> {
        self.read().get(key).map(|mr| MrFacts {
            pd: mr.pd,
            key: mr.key,
            iova: mr.iova,
            access: mr.access,
            len: mr.len,
            rkey_valid: mr.rkey_valid.load(Ordering::Relaxed),
        })
    }

    /// Deregister `key`: `Err(false)` if there is no such region, `Err(true)` if windows
    /// are bound to it. Once it returns, no access reaches the region's bytes (an access
    /// that loaded the table before fails on the retired storage).
    pub fn remove(&self, key: u32) -> Result<(), bool> {
        let removed = self.update(|t| {
            let Some(mr) = t.get_arc(key).cloned() else {
                return Err(false);
            };
            if mr.windows.load(Ordering::SeqCst) > 0 {
                return Err(true);
            }
            t.slots[(key >> 8) as usize - 1] = None;
            Ok(mr)
        })?;
        removed.data.retire();
        Ok(())
    }

    /// Whether any region or window belongs to `pd`.
    pub fn any_in_pd(&self, pd: PdId) -> bool {
        self.read().slots.iter().flatten().any(|s| match s {
            Slot::Mr(s) => s.pd == pd,
            Slot::Mw(mw) => mw.pd == pd,
        })
    }

    /// SEND with invalidate (IBTA 10.6.7.3) or LOCAL_INV: the R_Key `key` stops
    /// working. For a region: of PD `pd`. For a window: type 2, bound, in PD `pd`; a remote
    /// invalidation (`from_qp`) must arrive on the QP the window is bound to. False if
    /// nothing may be invalidated (a type 1 window never is, IBTA 10.6.7.1).
    pub fn invalidate(&self, key: u32, pd: PdId, from_qp: Option<u32>) -> bool {
        let t = self.read();
        if let Some(mr) = t.get(key) {
            if mr.pd != pd {
                return false;
            }
            mr.rkey_valid.store(false, Ordering::SeqCst);
            return true;
        }
        let Some(mw) = t.window(key) else {
            return false;
        };
        let mut st = mw.state();
        let ok = mw.mw_type == MwType::Type2
            && mw.pd == pd
            && st.rkey == key
            && st
                .binding
                .as_ref()
                .is_some_and(|b| from_qp.is_none() || b.qpn == from_qp);
        if ok {
            if let Some(b) = st.binding.take() {
                b.mr.windows.fetch_sub(1, Ordering::SeqCst);
            }
        }
        ok
    }

    /// Allocate a window of PD `pd`; `None` when the key space is used up.
    pub fn alloc_window(&self, pd: PdId, mw_type: MwType) -> Option<(MwId, u32)> {
        self.update(|t| {
            let (idx, key) = t.take_slot()?;
            let id = MwId(key >> 8);
            t.slots[idx] = Some(Slot::Mw(Arc::new(Mw {
                pd,
                mw_type,
                id,
                state: Mutex::new(MwState {
                    rkey: key,
                    posted_rkey: key,
                    binding: None,
                }),
            })));
            Some((id, key))
        })
    }

    /// Deallocate a window (a bound one lets its region go); false if there is none.
    pub fn dealloc_window(&self, id: MwId) -> bool {
        self.update(|t| {
            let key = id.0 << 8;
            let Some(mw) = t.window(key).filter(|mw| mw.id == id).cloned() else {
                return false;
            };
            if let Some(b) = mw.state().binding.take() {
                b.mr.windows.fetch_sub(1, Ordering::SeqCst);
            }
            t.slots[id.0 as usize - 1] = None;
            true
        })
    }

    /// The facts of window `id`.
    pub fn window_facts(&self, id: MwId) -> Option<MwFacts> {
        let t = self.read();
        let mw = t.window(id.0 << 8).filter(|mw| mw.id == id)?;
        let st = mw.state();
        Some(MwFacts {
            pd: mw.pd,
            mw_type: mw.mw_type,
            rkey: st.rkey,
            posted_rkey: st.posted_rkey,
            bound: st
                .binding
                .as_ref()
                .map(|b| (b.mr.key, b.addr, b.len, b.access, b.qpn)),
        })
    }

    /// A type 1 bind is being posted with R_Key `rkey`: the next one starts from it.
    pub fn set_posted_rkey(&self, id: MwId, rkey: u32) {
        if let Some(mw) = self.read().window(id.0 << 8).filter(|mw| mw.id == id) {
            mw.state().posted_rkey = rkey;
        }
    }

    /// Execute a bind (IBTA 10.6.7.2) for the QP `qpn` of PD `qp_pd`: window `id` takes
    /// R_Key `rkey` and the range `bind`. Refused binds change nothing.
    pub fn bind_window(
        &self,
        id: MwId,
        rkey: u32,
        bind: &MwBindInfo,
        qp_pd: PdId,
        qpn: u32,
    ) -> Result<(), BindFault> {
        // Under the writer lock: the region cannot be deregistered half-way through.
        let _writer = self.slots.write_lock();
        let t = self.read();
        let mw = t
            .window(rkey)
            .filter(|mw| mw.id == id)
            .ok_or(BindFault::NoSuchWindow)?;
        if mw.pd != qp_pd {
            return Err(BindFault::WrongPd);
        }
        let mut st = mw.state();
        let type2 = mw.mw_type == MwType::Type2;
        if type2 && st.binding.is_some() {
            return Err(BindFault::NotFree);
        }
        let binding = if bind.length == 0 {
            if type2 {
                return Err(BindFault::ZeroLength);
            }
            None
        } else {
            let mr = t.get_arc(bind.mr_lkey).ok_or(BindFault::NoSuchMr)?;
            if mr.pd != mw.pd {
                return Err(BindFault::WrongPd);
            }
            let writes = bind
                .access
                .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
            if !mr.access.contains(Access::MW_BIND)
                || writes && !mr.access.contains(Access::LOCAL_WRITE)
            {
                return Err(BindFault::NoPermission);
            }
            mr.range(bind.addr, bind.length)
                .ok_or(BindFault::OutOfBounds)?;
            Some(MwBinding {
                mr: mr.clone(),
                addr: bind.addr,
                len: bind.length,
                access: bind.access,
                qpn: type2.then_some(qpn),
            })
        };
        if let Some(b) = &binding {
            b.mr.windows.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(old) = std::mem::replace(&mut st.binding, binding) {
            old.mr.windows.fetch_sub(1, Ordering::SeqCst);
        }
        st.rkey = rkey;
        if type2 {
            st.posted_rkey = rkey;
        }
        Ok(())
    }

    /// Check a remote access through an R_Key, a region's or a window's (responder side,
    /// IBTA 9.7.4.1.5).
    pub fn check_remote(&self, a: &RemoteAccess) -> Result<(), AccessFault> {
        let t = self.read();
        if let Some(mw) = t.window(a.rkey) {
            let st = mw.state();
            return window_range(mw, &st, a).map(|_| ());
        }
        let mr = t.get(a.rkey).ok_or(AccessFault::BadKey)?;
        check_region(mr, a)?;
        Ok(())
    }

    /// Check a remote access and run `f` on its bytes, as one step: a window's binding is
    /// held (and a region's R_Key checked again) for as long as `f` runs, so an invalidation
    /// is either before the access (which is then refused) or after it. `f` must not touch
    /// the table.
    pub fn with_remote<R>(
        &self,
        a: &RemoteAccess,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessFault> {
        let t = self.read();
        if let Some(mw) = t.window(a.rkey) {
            let st = mw.state();
            let r = window_range(mw, &st, a)?;
            let b = st.binding.as_ref().ok_or(AccessFault::BadKey)?;
            return b.mr.data.with(r, f).ok_or(AccessFault::BadKey);
        }
        let mr = t.get(a.rkey).ok_or(AccessFault::BadKey)?;
        let r = check_region(mr, a)?;
        // Gone: the application's memory was deregistered or moved meanwhile.
        mr.data.with(r, f).ok_or(AccessFault::BadKey)
    }

    /// Runs `f` on the payload of an outgoing packet: `key` is the lkey of a request's SGE
    /// or the R_Key of a READ response (checked when the response was queued). A window's
    /// R_Key counts only while the window still grants the read of that range. `None` if
    /// the bytes are gone.
    pub fn with_payload<R>(
        &self,
        key: u32,
        va: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let t = self.read();
        // One slot lookup: the key's index names a region or a window.
        let mw = match t.slot(key)? {
            Slot::Mr(s) if s.key == key => return s.mr.data.with(s.range(va, len)?, |b| f(b)),
            Slot::Mr(_) => return None,
            Slot::Mw(mw) => mw,
        };
        let st = mw.state();
        let b = st.binding.as_ref()?;
        let a = RemoteAccess {
            rkey: key,
            pd: mw.pd,
            qpn: b.qpn.unwrap_or(0),
            va,
            len,
            need: Access::REMOTE_READ,
        };
        let r = window_range(mw, &st, &a).ok()?;
        b.mr.data.with(r, |bytes| f(bytes))
    }

    /// Check an SGE list for a local access; returns the total length.
    pub fn check_sges(&self, pd: PdId, sges: &[Sge], need: Access) -> Result<u64, AccessFault> {
        let t = self.read();
        let mut total = 0u64;
        for sge in sges {
            let mr = t.entry(sge.lkey).ok_or(AccessFault::BadKey)?;
            if mr.pd != pd {
                return Err(AccessFault::WrongPd);
            }
            if !mr.access.contains(need) {
                return Err(AccessFault::NoPermission);
            }
            mr.range(sge.addr, sge.length as u64)
                .ok_or(AccessFault::OutOfBounds)?;
            // At most max_sge x u32::MAX: no overflow in u64.
            total += sge.length as u64;
        }
        Ok(total)
    }

    /// The checks of a receive WR's SGEs when it is posted: each names a region with local
    /// write, and its range is inside; returns the total length. The PD is checked when the
    /// buffers are written ([`MrTable::scatter_to_receive`]), as hardware providers do: a
    /// region may move to another PD between the post and the message (`ibv_rereg_mr`), and
    /// then the message fails, not the post.
    pub fn check_recv_sges(&self, sges: &[Sge]) -> Result<u64, AccessFault> {
        let t = self.read();
        let mut total = 0u64;
        for sge in sges {
            let mr = t.entry(sge.lkey).ok_or(AccessFault::BadKey)?;
            if !mr.access.contains(Access::LOCAL_WRITE) {
                return Err(AccessFault::NoPermission);
            }
            mr.range(sge.addr, sge.length as u64)
                .ok_or(AccessFault::OutOfBounds)?;
            // At most max_sge x u32::MAX: no overflow in u64.
            total += sge.length as u64;
        }
        Ok(total)
    }

    /// [`MrTable::scatter`] into a receive WR's buffers, each of which must still be a region
    /// of `pd` with local write (IBTA 10.6: a region serves the QPs of its own PD; the L_Key
    /// is checked when it is used); false, and nothing written, if one is not.
    pub fn scatter_to_receive(&self, pd: PdId, sges: &[Sge], offset: u64, data: &[u8]) -> bool {
        let t = self.read();
        let usable = sges.iter().all(|sge| {
            t.entry(sge.lkey)
                .is_some_and(|mr| mr.pd == pd && mr.access.contains(Access::LOCAL_WRITE))
        });
        usable && scatter_in(&t, sges, offset, data)
    }

    /// Copy `out.len()` bytes starting `offset` bytes into the SGE list's data.
    /// Returns false if the SGEs are no longer valid (MR deregistered meanwhile).
    pub fn gather(&self, sges: &[Sge], offset: u64, out: &mut [u8]) -> bool {
        walk_sges(&self.read(), sges, offset, out.len(), |mr, r, piece| {
            mr.mr.data.with(r, |b| out[piece].copy_from_slice(b))
        })
    }

    /// Copy an inline SGE list's bytes into `out`, finding each SGE's memory by its address
    /// alone: as for `IBV_SEND_INLINE`, where the provider reads the caller's memory itself,
    /// the lkey is not checked (fresh iova ranges never overlap, so an address names one
    /// region; of regions placed at a chosen iova that overlap, the first covering the range
    /// is read). False if an SGE is not inside a registered region.
    pub fn gather_by_addr(&self, sges: &[Sge], out: &mut [u8]) -> bool {
        let t = self.read();
        let mut done = 0usize;
        for sge in sges {
            let len = sge.length as usize;
            if out.len() - done < len {
                return false;
            }
            let found = t.mrs().find(|mr| mr.range(sge.addr, len as u64).is_some());
            let dst = &mut out[done..done + len];
            let copied = found
                .and_then(|mr| mr.with_range(sge.addr, len as u64, |b| dst.copy_from_slice(b)));
            if copied.is_none() {
                return false;
            }
            done += len;
        }
        done == out.len()
    }

    /// Copy `data` into the SGE list starting `offset` bytes in. Returns false if it does
    /// not fit or an MR is gone.
    pub fn scatter(&self, sges: &[Sge], offset: u64, data: &[u8]) -> bool {
        scatter_in(&self.read(), sges, offset, data)
    }

    /// Whether `[va, va+len)` lies inside the MR `key`.
    pub fn in_bounds(&self, key: u32, va: u64, len: u64) -> bool {
        self.read()
            .entry(key)
            .is_some_and(|mr| mr.range(va, len).is_some())
    }

    /// Runs `f` on the bytes at `[va, va+len)` of the MR `key` (already checked by
    /// `check_remote`); `None` if they are gone. `f` must not touch the table.
    pub fn with_bytes<R>(
        &self,
        key: u32,
        va: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let t = self.read();
        t.get(key)?.with_range(va, len, |b| f(b))
    }

    /// Runs `f` on the writable bytes at `[va, va+len)` of the MR `key`; `None` if they are
    /// gone. `f` must not touch the table.
    pub fn with_bytes_mut<R>(
        &self,
        key: u32,
        va: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let t = self.read();
        t.get(key)?.with_range(va, len, f)
    }
}
