//! The device limits: what the engine enforces and the verbs layer reports
//! (`ibv_query_device`, `xroce devinfo`), comparable to rxe's `rxe_param.h`. One set: verbs
//! checks the same constants before it calls the engine, so its errors can name the limit.

/// Queue pairs per device (counted by the verbs layer).
pub const MAX_QP: u32 = 1024;
/// Work requests per send or receive queue.
pub const MAX_QP_WR: u32 = 16 * 1024;
/// SGEs per work request.
pub const MAX_SGE: u32 = 32;
/// Completion queues per device (counted by the verbs layer).
pub const MAX_CQ: u32 = 1024;
/// Entries per completion queue: mlx5's (2^22 - 1). libfabric's rxm asks for 262,144; a
/// CQ's storage grows with the completions it holds, not with its depth.
pub const MAX_CQE: u32 = (1 << 22) - 1;
/// Memory regions per device (counted by the verbs layer).
pub const MAX_MR: u32 = 4096;
/// Protection domains per device (counted by the verbs layer).
pub const MAX_PD: u32 = 1024;
/// Largest memory region (1 GiB: MRs are owned, heap-allocated buffers).
pub const MAX_MR_SIZE: u64 = 1 << 30;
/// Outstanding READ/ATOMIC per QP, each direction (`max_rd_atomic`, `max_dest_rd_atomic`;
/// rxe: 128).
pub const MAX_RD_ATOMIC: u32 = 128;
/// Inline data per send WR.
pub const MAX_INLINE_DATA: u32 = 256;
/// Address handles per device (counted by the verbs layer).
pub const MAX_AH: u32 = 4096;
/// Memory windows per device (counted by the verbs layer).
pub const MAX_MW: u32 = 4096;
/// Largest message: 2^31 bytes, what `max_msg_sz` announces and the most a request may
/// carry or ask for. A longer RETH DMA length is an invalid request: "the length specified in
/// an RDMA request is greater than 2^31 bytes" is one of the causes of a Remote Invalid
/// Request listed for that completion status (vendor manuals quote it, e.g. Marvell
/// FastLinQ's RoCE error table); rxe checks the same (`check_length`, class C, NAK Invalid
/// Request).
pub const MAX_MSG_SZ: u32 = 1 << 31;
/// Shared receive queues per device (counted by the verbs layer; rxe: 4032).
pub const MAX_SRQ: u32 = 1024;
/// Work requests per shared receive queue (rxe's `max_srq_wr`).
pub const MAX_SRQ_WR: u32 = 16 * 1024;
/// SGEs per shared receive queue WR.
pub const MAX_SRQ_SGE: u32 = MAX_SGE;
