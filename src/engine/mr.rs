//! Memory regions: the engine owns each MR's bytes (a `Vec<u8>` at an iova base), so the
//! transport can read and write them without `unsafe`; the verbs layer reaches them through
//! `Engine::mr_read` / `mr_write`.
//!
//! The table is shared by the engine shards of one device ([`super::Engine::new_shards`]):
//! any shard's responder may write a region another shard's requester reads. Readers load
//! the current table through an `ArcSwap` (no shared lock: cores reading it do not contend
//! for a cache line); registering and deregistering publish a new copy. Each region's bytes
//! are behind their own mutex, held for one copy: shards working on different regions never
//! wait for each other, as on an HCA whose DMA engines work in parallel.
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
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, Guard};

use super::types::{Access, MwBindInfo, MwId, MwType, PdId, Sge};

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
    /// Memory windows bound to the region: it cannot be deregistered while any is
    /// (IBTA 10.6.7: a region with bound windows is not deregistered).
    windows: AtomicU32,
    data: Mutex<Vec<u8>>,
}

impl Mr {
    /// The byte range of `[addr, addr+len)` inside the region, if it is in bounds.
    pub fn range(&self, addr: u64, len: u64) -> Option<std::ops::Range<usize>> {
        let start = addr.checked_sub(self.iova)?;
        let end = start.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some(start as usize..end as usize)
    }

    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        // A copy that panicked half-way leaves bytes, not a broken invariant.
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
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
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    current: ArcSwap<MrSlots>,
    /// Held by whoever publishes a new table (register, remove) or binds a window, so no
    /// change is lost and no region is deregistered under a bind.
    writer: Mutex<()>,
}

#[derive(Clone, Debug)]
enum Slot {
    Mr(Arc<Mr>),
    Mw(Arc<Mw>),
}

#[derive(Clone, Debug, Default)]
struct MrSlots {
    slots: Vec<Option<Slot>>,
    tags: Vec<u8>,
    next_iova: u64,
}

impl MrSlots {
    fn get(&self, key: u32) -> Option<&Mr> {
        match self.slot(key)? {
            Slot::Mr(mr) if mr.key == key => Some(mr),
            _ => None,
        }
    }

    /// The region `key` names, shared.
    fn get_arc(&self, key: u32) -> Option<&Arc<Mr>> {
        match self.slot(key)? {
            Slot::Mr(mr) if mr.key == key => Some(mr),
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
            Slot::Mr(mr) => Some(mr),
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

/// Base of the iova space handed out to MRs: far from zero so a null address never matches.
const IOVA_BASE: u64 = 0x0000_7f00_0000_0000;

impl MrTable {
    fn read(&self) -> Guard<Arc<MrSlots>> {
        self.current.load()
    }

    /// Runs `change` on a copy of the table and publishes the copy.
    fn update<R>(&self, change: impl FnOnce(&mut MrSlots) -> R) -> R {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut table = MrSlots::clone(&self.current.load());
        let out = change(&mut table);
        self.current.store(Arc::new(table));
        out
    }

    /// Register `len` zeroed bytes; returns (key, iova), or `None` when the iova space is
    /// used up (never wrapped: two regions must not overlap).
    pub fn register(&self, pd: PdId, len: usize, access: Access) -> Option<(u32, u64)> {
        self.update(|t| t.register(pd, len, access))
    }
}

impl MrSlots {
    fn register(&mut self, pd: PdId, len: usize, access: Access) -> Option<(u32, u64)> {
        let t = self;
        if t.next_iova == 0 {
            t.next_iova = IOVA_BASE;
        }
        let iova = t.next_iova;
        // Page-align the next region and leave a guard page between regions.
        let next = (len as u64)
            .checked_add(4095)
            .map(|l| l & !4095)
            .and_then(|l| l.checked_add(4096))
            .and_then(|l| iova.checked_add(l))?;
        let (idx, key) = t.take_slot()?;
        t.next_iova = next;
        t.slots[idx] = Some(Slot::Mr(Arc::new(Mr {
            pd,
            key,
            iova,
            access,
            len,
            rkey_valid: AtomicBool::new(true),
            windows: AtomicU32::new(0),
            data: Mutex::new(vec![0; len]),
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
    /// are bound to it.
    pub fn remove(&self, key: u32) -> Result<(), bool> {
        self.update(|t| {
            let Some(mr) = t.get(key) else {
                return Err(false);
            };
            if mr.windows.load(Ordering::SeqCst) > 0 {
                return Err(true);
            }
            t.slots[(key >> 8) as usize - 1] = None;
            Ok(())
        })
    }

    /// Whether any region or window belongs to `pd`.
    pub fn any_in_pd(&self, pd: PdId) -> bool {
        self.read().slots.iter().flatten().any(|s| match s {
            Slot::Mr(mr) => mr.pd == pd,
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
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
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
            let mut bytes = b.mr.bytes();
            return Ok(f(&mut bytes[r]));
        }
        let mr = t.get(a.rkey).ok_or(AccessFault::BadKey)?;
        let r = check_region(mr, a)?;
        let mut bytes = mr.bytes();
        Ok(f(&mut bytes[r]))
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
        if let Some(mw) = t.window(key) {
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
            let bytes = b.mr.bytes();
            return Some(f(&bytes[r]));
        }
        let mr = t.get(key)?;
        let r = mr.range(va, len)?;
        let bytes = mr.bytes();
        Some(f(&bytes[r]))
    }

    /// Check an SGE list for a local access; returns the total length.
    pub fn check_sges(&self, pd: PdId, sges: &[Sge], need: Access) -> Result<u64, AccessFault> {
        let t = self.read();
        let mut total = 0u64;
        for sge in sges {
            let mr = t.get(sge.lkey).ok_or(AccessFault::BadKey)?;
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

    /// Copy `out.len()` bytes starting `offset` bytes into the SGE list's data.
    /// Returns false if the SGEs are no longer valid (MR deregistered meanwhile).
    pub fn gather(&self, sges: &[Sge], mut offset: u64, out: &mut [u8]) -> bool {
        let t = self.read();
        let mut done = 0usize;
        for sge in sges {
            if done == out.len() {
                break;
            }
            if offset >= sge.length as u64 {
                offset -= sge.length as u64;
                continue;
            }
            let take = ((sge.length as u64 - offset) as usize).min(out.len() - done);
            let Some(mr) = t.get(sge.lkey) else {
                return false;
            };
            let Some(r) = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.range(a, take as u64))
            else {
                return false;
            };
            out[done..done + take].copy_from_slice(&mr.bytes()[r]);
            done += take;
            offset = 0;
        }
        done == out.len()
    }

    /// Copy an inline SGE list's bytes into `out`, finding each SGE's memory by its address
    /// alone: as for `IBV_SEND_INLINE`, where the provider reads the caller's memory itself,
    /// the lkey is not checked (iovas of regions never overlap, so an address names one
    /// region). False if an SGE is not inside a registered region.
    pub fn gather_by_addr(&self, sges: &[Sge], out: &mut [u8]) -> bool {
        let t = self.read();
        let mut done = 0usize;
        for sge in sges {
            let len = sge.length as usize;
            if out.len() - done < len {
                return false;
            }
            let found = t
                .mrs()
                .find_map(|mr| mr.range(sge.addr, len as u64).map(|r| (mr, r)));
            let Some((mr, r)) = found else {
                return false;
            };
            out[done..done + len].copy_from_slice(&mr.bytes()[r]);
            done += len;
        }
        done == out.len()
    }

    /// Copy `data` into the SGE list starting `offset` bytes in. Returns false if it does
    /// not fit or an MR is gone.
    pub fn scatter(&self, sges: &[Sge], mut offset: u64, data: &[u8]) -> bool {
        let t = self.read();
        let mut done = 0usize;
        for sge in sges {
            if done == data.len() {
                break;
            }
            if offset >= sge.length as u64 {
                offset -= sge.length as u64;
                continue;
            }
            let take = ((sge.length as u64 - offset) as usize).min(data.len() - done);
            let Some(mr) = t.get(sge.lkey) else {
                return false;
            };
            let Some(r) = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.range(a, take as u64))
            else {
                return false;
            };
            mr.bytes()[r].copy_from_slice(&data[done..done + take]);
            done += take;
            offset = 0;
        }
        done == data.len()
    }

    /// Whether `[va, va+len)` lies inside the MR `key`.
    pub fn in_bounds(&self, key: u32, va: u64, len: u64) -> bool {
        self.read()
            .get(key)
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
        let mr = t.get(key)?;
        let r = mr.range(va, len)?;
        let bytes = mr.bytes();
        Some(f(&bytes[r]))
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
        let mr = t.get(key)?;
        let r = mr.range(va, len)?;
        let mut bytes = mr.bytes();
        Some(f(&mut bytes[r]))
    }
}
