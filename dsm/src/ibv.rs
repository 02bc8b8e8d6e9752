//! libibverbs' ABI as rdma-core's `<infiniband/verbs.h>` defines it, cut to what the data plane
//! uses: the structs it fills or reads, the constants it passes and the types of the entry points
//! it calls. Pure declarations; [`crate::verbs`] loads the library and makes the calls.
//!
//! These are rdma-core's stable `IBVERBS_1.1` types (the symbol version every libibverbs since
//! 2016 exports by default); the sizes and offsets below are those of the C compiler on 64-bit
//! Linux (x86_64, aarch64) and are checked at compile time, so a mistyped field fails the build.
//! Handles the library allocates are declared only up to the last field read (`context`,
//! `qp_num`, `lkey`/`rkey`) and are only ever used behind a pointer.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{align_of, offset_of, size_of};

/// The soname loaded at run time (rdma-core's `libibverbs1` package).
pub const LIBRARY: &str = "libibverbs.so.1";

/// `struct ibv_device`, `struct ibv_pd`: opaque.
#[repr(C)]
pub struct Device {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct Pd {
    _opaque: [u8; 0],
}

/// `struct ibv_context_ops`: 32 function pointers; `ibv_poll_cq` and `ibv_post_send` are inline
/// functions in verbs.h that call through slots 11 and 25.
#[repr(C)]
pub struct ContextOps {
    _before_poll_cq: [*const c_void; 11],
    pub poll_cq: Option<PollCq>,
    _before_post_send: [*const c_void; 13],
    pub post_send: Option<PostSend>,
    _after_post_send: [*const c_void; 6],
}

/// `struct ibv_context`, up to its ops.
#[repr(C)]
pub struct Context {
    pub device: *mut Device,
    pub ops: ContextOps,
}

/// `struct ibv_cq`, up to its context.
#[repr(C)]
pub struct Cq {
    pub context: *mut Context,
}

/// `struct ibv_qp`, up to `qp_num`.
#[repr(C)]
pub struct Qp {
    pub context: *mut Context,
    pub qp_context: *mut c_void,
    pub pd: *mut Pd,
    pub send_cq: *mut Cq,
    pub recv_cq: *mut Cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_mr`, whole.
#[repr(C)]
pub struct Mr {
    pub context: *mut Context,
    pub pd: *mut Pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `union ibv_gid`: 16 bytes, 8-aligned (its other member is two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gid {
    pub raw: [u8; 16],
}

/// `struct ibv_port_attr` (rdma-core 28+, the largest layout `ibv_query_port` may fill).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub active_speed_ex: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Debug)]
pub struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut Cq,
    pub recv_cq: *mut Cq,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalRoute {
    pub dgid: Gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AhAttr {
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RdmaWr {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AtomicWr {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr` (declared for the union's size only).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UdWr {
    pub ah: *mut c_void,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`: `rdma` and `atomic` put `rkey` at different offsets.
#[repr(C)]
#[derive(Clone, Copy)]
pub union WrUnion {
    pub rdma: RdmaWr,
    pub atomic: AtomicWr,
    pub ud: UdWr,
}

/// `struct ibv_send_wr`. The trailing union (`bind_mw` / `tso`, 48 bytes) is never used here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub wr: WrUnion,
    pub qp_type: u32,
    pub bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

// Entry points exported by libibverbs.so.1 (default version IBVERBS_1.1).
pub type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut Device;
pub type FreeDeviceList = unsafe extern "C" fn(*mut *mut Device);
pub type GetDeviceName = unsafe extern "C" fn(*mut Device) -> *const c_char;
pub type OpenDevice = unsafe extern "C" fn(*mut Device) -> *mut Context;
pub type CloseDevice = unsafe extern "C" fn(*mut Context) -> c_int;
pub type QueryPort = unsafe extern "C" fn(*mut Context, u8, *mut PortAttr) -> c_int;
pub type QueryGid = unsafe extern "C" fn(*mut Context, u8, c_int, *mut Gid) -> c_int;
pub type AllocPd = unsafe extern "C" fn(*mut Context) -> *mut Pd;
pub type DeallocPd = unsafe extern "C" fn(*mut Pd) -> c_int;
pub type RegMr = unsafe extern "C" fn(*mut Pd, *mut c_void, usize, c_int) -> *mut Mr;
pub type DeregMr = unsafe extern "C" fn(*mut Mr) -> c_int;
/// `(context, cqe, cq_context, channel, comp_vector)`.
pub type CreateCq =
    unsafe extern "C" fn(*mut Context, c_int, *mut c_void, *mut c_void, c_int) -> *mut Cq;
pub type DestroyCq = unsafe extern "C" fn(*mut Cq) -> c_int;
pub type CreateQp = unsafe extern "C" fn(*mut Pd, *mut QpInitAttr) -> *mut Qp;
pub type ModifyQp = unsafe extern "C" fn(*mut Qp, *mut QpAttr, c_int) -> c_int;
pub type DestroyQp = unsafe extern "C" fn(*mut Qp) -> c_int;
// Provider entry points, through `context->ops`.
pub type PollCq = unsafe extern "C" fn(*mut Cq, c_int, *mut Wc) -> c_int;
pub type PostSend = unsafe extern "C" fn(*mut Qp, *mut SendWr, *mut *mut SendWr) -> c_int;

// enum ibv_access_flags
pub const ACCESS_LOCAL_WRITE: c_int = 1;
pub const ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const ACCESS_REMOTE_READ: c_int = 1 << 2;
pub const ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;

// enum ibv_qp_type, enum ibv_qp_state
pub const QPT_RC: u32 = 2;
pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;

// enum ibv_qp_attr_mask
pub const QP_STATE: c_int = 1;
pub const QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const QP_PKEY_INDEX: c_int = 1 << 4;
pub const QP_PORT: c_int = 1 << 5;
pub const QP_AV: c_int = 1 << 7;
pub const QP_TIMEOUT: c_int = 1 << 9;
pub const QP_RETRY_CNT: c_int = 1 << 10;
pub const QP_RNR_RETRY: c_int = 1 << 11;
pub const QP_RQ_PSN: c_int = 1 << 12;
pub const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const QP_SQ_PSN: c_int = 1 << 16;
pub const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const QP_PATH_MTU: c_int = 1 << 8;
pub const QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_wr_opcode, enum ibv_send_flags
pub const WR_RDMA_WRITE: u32 = 0;
pub const WR_RDMA_READ: u32 = 4;
pub const WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub const WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub const SEND_SIGNALED: c_uint = 1 << 1;

/// `enum ibv_wc_status` 0..=23, named as errors are reported (`RetryCounterExceededError`).
const WC_STATUS: [&str; 24] = [
    "Success",
    "LocalLengthError",
    "LocalQueuePairOperationError",
    "LocalEndToEndContextOperationError",
    "LocalProtectionError",
    "WorkRequestFlushedError",
    "MemoryWindowBindError",
    "BadResponseError",
    "LocalAccessError",
    "RemoteInvalidRequestError",
    "RemoteAccessError",
    "RemoteOperationError",
    "RetryCounterExceededError",
    "ResponderNotReadyRetryCounterExceededError",
    "LocalReliableDatagramDomainViolationError",
    "RemoteInvalidReliableDatagramRequest",
    "RemoteAbortedError",
    "InvalidEndToEndContextNumberError",
    "InvalidEndToEndContextStateError",
    "FatalError",
    "ResponseTimeoutError",
    "GeneralError",
    "TagMatchingError",
    "TagMatchingRendezvousIncomplete",
];

/// `IBV_WC_SUCCESS`.
pub const WC_SUCCESS: u32 = 0;

/// The name of a work completion status (a number a newer rdma-core may add is shown as such).
pub fn wc_status_name(status: u32) -> String {
    WC_STATUS.get(status as usize).map_or_else(
        || format!("WorkCompletionStatus({status})"),
        |s| s.to_string(),
    )
}

// The C layouts (LP64): sizes, alignments and the offsets providers read.
const _: () = {
    assert!(size_of::<ContextOps>() == 32 * 8);
    assert!(offset_of!(Context, ops) == 8);
    assert!(offset_of!(ContextOps, poll_cq) == 11 * 8);
    assert!(offset_of!(ContextOps, post_send) == 25 * 8);
    assert!(offset_of!(Qp, qp_num) == 52);
    assert!(offset_of!(Mr, lkey) == 36 && offset_of!(Mr, rkey) == 40);
    assert!(size_of::<Gid>() == 16 && align_of::<Gid>() == 8);
    assert!(size_of::<PortAttr>() == 56 && offset_of!(PortAttr, active_mtu) == 8);
    assert!(size_of::<QpCap>() == 20);
    assert!(size_of::<QpInitAttr>() == 64 && offset_of!(QpInitAttr, qp_type) == 52);
    assert!(size_of::<GlobalRoute>() == 24 && offset_of!(GlobalRoute, traffic_class) == 22);
    assert!(size_of::<AhAttr>() == 32 && offset_of!(AhAttr, port_num) == 30);
    assert!(offset_of!(AhAttr, dlid) == 24 && offset_of!(AhAttr, is_global) == 29);
    assert!(size_of::<QpAttr>() == 144 && align_of::<QpAttr>() == 8);
    assert!(offset_of!(QpAttr, cap) == 36 && offset_of!(QpAttr, ah_attr) == 56);
    assert!(offset_of!(QpAttr, alt_ah_attr) == 88 && offset_of!(QpAttr, pkey_index) == 120);
    assert!(offset_of!(QpAttr, max_rd_atomic) == 126 && offset_of!(QpAttr, min_rnr_timer) == 128);
    assert!(offset_of!(QpAttr, alt_timeout) == 134 && offset_of!(QpAttr, rate_limit) == 136);
    assert!(size_of::<Sge>() == 16);
    assert!(size_of::<AtomicWr>() == 32 && offset_of!(AtomicWr, rkey) == 24);
    assert!(offset_of!(RdmaWr, rkey) == 8 && size_of::<WrUnion>() == 32);
    assert!(size_of::<SendWr>() == 128 && align_of::<SendWr>() == 8);
    assert!(offset_of!(SendWr, num_sge) == 24 && offset_of!(SendWr, send_flags) == 32);
    assert!(offset_of!(SendWr, wr) == 40 && offset_of!(SendWr, qp_type) == 72);
    assert!(offset_of!(SendWr, bind_mw_or_tso) == 80);
    assert!(size_of::<Wc>() == 48 && offset_of!(Wc, qp_num) == 28);
    assert!(offset_of!(Wc, wc_flags) == 36 && offset_of!(Wc, dlid_path_bits) == 45);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_statuses_are_named_as_errors_report_them() {
        assert_eq!(wc_status_name(WC_SUCCESS), "Success");
        assert_eq!(wc_status_name(5), "WorkRequestFlushedError");
        assert_eq!(wc_status_name(10), "RemoteAccessError");
        assert_eq!(wc_status_name(12), "RetryCounterExceededError");
        assert_eq!(wc_status_name(23), "TagMatchingRendezvousIncomplete");
        assert_eq!(wc_status_name(99), "WorkCompletionStatus(99)");
    }
}
