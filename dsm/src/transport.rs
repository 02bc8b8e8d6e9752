//! What the data plane asks of the HCA, built as rdma-core's structs (pure): the one-sided work
//! requests ([`Op`], [`Work`]) and the reliable-connected queue pair's path to RTS, with the
//! peer's GID as global route and the fabric's traffic class. [`crate::verbs`] hands them over.

use std::ffi::c_int;
use std::ptr::null_mut;

use crate::ibv;
use crate::wire::QpAddress;

/// One-sided operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Write,
    Read,
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

/// One work request: `len` bytes between local `offset` of a registered staging buffer and the
/// remote virtual address `remote` under `rkey`.
#[derive(Clone, Copy, Debug)]
pub struct Work {
    pub id: u64,
    pub op: Op,
    pub offset: u64,
    pub len: u32,
    pub remote: u64,
    pub rkey: u32,
}

/// A post the HCA refused from its `accepted`-th request on: the ones before it were posted and
/// complete as usual.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostError {
    pub accepted: usize,
    pub reason: String,
}

/// Ack timeout exponent (4.096 us x 2^16 = 268 ms) and retries: a dead peer is reported within
/// about two seconds (7 x 268 ms), also under emulation, where round trips take milliseconds.
const ACK_TIMEOUT: u8 = 16;
const RETRIES: u8 = 7;
/// Receiver-not-ready: 7 retries means "forever" (no receives are ever posted), 12 = 0.64 ms.
const RNR_RETRY: u8 = 7;
const MIN_RNR_TIMER: u8 = 12;
/// Outstanding RDMA reads and atomics per queue pair, each way.
const READ_ATOMIC_DEPTH: u8 = 8;
/// GRH hop limit of the fabric's packets.
const HOP_LIMIT: u8 = 64;

/// The work request for `w` with its one scatter/gather entry at `sge` (the caller links them).
pub(crate) fn send_wr(w: &Work, sge: *mut ibv::Sge) -> ibv::SendWr {
    let rdma = ibv::WrUnion {
        rdma: ibv::RdmaWr {
            remote_addr: w.remote,
            rkey: w.rkey,
        },
    };
    let atomic = |compare_add, swap| ibv::WrUnion {
        atomic: ibv::AtomicWr {
            remote_addr: w.remote,
            compare_add,
            swap,
            rkey: w.rkey,
        },
    };
    let (opcode, wr) = match w.op {
        Op::Write => (ibv::WR_RDMA_WRITE, rdma),
        Op::Read => (ibv::WR_RDMA_READ, rdma),
        Op::CompareSwap { compare, swap } => (ibv::WR_ATOMIC_CMP_AND_SWP, atomic(compare, swap)),
        Op::FetchAdd { add } => (ibv::WR_ATOMIC_FETCH_AND_ADD, atomic(add, 0)),
    };
    ibv::SendWr {
        wr_id: w.id,
        next: null_mut(),
        sg_list: sge,
        num_sge: 1,
        opcode,
        send_flags: ibv::SEND_SIGNALED,
        imm_data: 0,
        wr,
        qp_type: 0,
        bind_mw_or_tso: [0; 6],
    }
}

/// The linked work requests of one post, with their scatter/gather entries. The requests point
/// at each other and into the entries, inside the two vectors' heap buffers: [`Requests::fill`]
/// rebuilds every pointer, and neither buffer changes until the post returns. A queue pair keeps
/// one and refills it per post, so a post allocates nothing once the buffers have grown.
#[derive(Default)]
pub(crate) struct Requests {
    sges: Vec<ibv::Sge>,
    wrs: Vec<ibv::SendWr>,
}

impl Requests {
    /// The requests for `works`, whose local sides lie at `base` + offset under `lkey`.
    pub(crate) fn fill(&mut self, works: &[Work], base: u64, lkey: u32) {
        self.sges.clear();
        self.sges.extend(works.iter().map(|w| ibv::Sge {
            addr: base + w.offset,
            length: w.len,
            lkey,
        }));
        let at = self.sges.as_mut_ptr();
        self.wrs.clear();
        self.wrs.extend(
            works
                .iter()
                .enumerate()
                .map(|(i, w)| send_wr(w, at.wrapping_add(i))),
        );
        let first = self.wrs.as_mut_ptr();
        for i in 1..self.wrs.len() {
            self.wrs[i - 1].next = first.wrapping_add(i);
        }
    }

    /// The head of the list, as `ibv_post_send` takes it.
    pub(crate) fn first(&mut self) -> *mut ibv::SendWr {
        self.wrs.as_mut_ptr()
    }

    /// How many requests a post accepted when it answered `bad`: those before `bad`; none when
    /// `bad` is not one of them.
    pub(crate) fn accepted_before(&self, bad: *const ibv::SendWr) -> usize {
        let size = size_of::<ibv::SendWr>();
        let offset = (bad as usize).wrapping_sub(self.wrs.as_ptr() as usize);
        if bad.is_null() || !offset.is_multiple_of(size) || offset / size >= self.wrs.len() {
            return 0;
        }
        offset / size
    }
}

/// A reliable-connected queue pair sending up to `depth` requests of one entry each, both its
/// queues on `cq`. No receives are ever posted (one-sided verbs only).
pub(crate) fn rc_init(cq: *mut ibv::Cq, depth: u32) -> ibv::QpInitAttr {
    ibv::QpInitAttr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: null_mut(),
        cap: ibv::QpCap {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: ibv::QPT_RC,
        sq_sig_all: 0,
    }
}

/// An `enum ibv_mtu` in bytes (IBV_MTU_256 is 1, each step doubles).
pub(crate) fn mtu_bytes(code: u32) -> u32 {
    128 << code.clamp(1, 5)
}

/// The largest `enum ibv_mtu` not above `bytes` (256 at least).
fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

/// The queue pair's own side of a connection: its port, GID index, path MTU (`enum ibv_mtu`),
/// traffic class and first packet sequence number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Local {
    pub port: u8,
    pub gid_index: u8,
    pub mtu: u32,
    pub tc: u8,
    pub psn: u32,
}

/// The three transitions of `verbs::Qp::connect`, each with its attribute mask and what
/// an error says it was doing: INIT (peers may read, write and do atomics on what this side
/// registered remotely), RTR (to `peer` over a global route from `local`'s GID with its traffic
/// class), RTS.
pub(crate) fn transitions(
    local: Local,
    peer: QpAddress,
) -> [(ibv::QpAttr, c_int, &'static str); 3] {
    let init = ibv::QpAttr {
        qp_state: ibv::QPS_INIT,
        pkey_index: 0,
        port_num: local.port,
        qp_access_flags: (ibv::ACCESS_REMOTE_WRITE
            | ibv::ACCESS_REMOTE_READ
            | ibv::ACCESS_REMOTE_ATOMIC) as u32,
        ..Default::default()
    };
    let rtr = ibv::QpAttr {
        qp_state: ibv::QPS_RTR,
        path_mtu: mtu_code(crate::wire::path_mtu(mtu_bytes(local.mtu), peer.mtu)),
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn,
        max_dest_rd_atomic: READ_ATOMIC_DEPTH,
        min_rnr_timer: MIN_RNR_TIMER,
        ah_attr: ibv::AhAttr {
            grh: ibv::GlobalRoute {
                dgid: ibv::Gid {
                    raw: peer.gid.octets(),
                },
                flow_label: 0,
                sgid_index: local.gid_index,
                hop_limit: HOP_LIMIT,
                traffic_class: local.tc,
            },
            dlid: 0,
            sl: 0,
            is_global: 1,
            port_num: local.port,
            ..Default::default()
        },
        ..Default::default()
    };
    let rts = ibv::QpAttr {
        qp_state: ibv::QPS_RTS,
        sq_psn: local.psn,
        timeout: ACK_TIMEOUT,
        retry_cnt: RETRIES,
        rnr_retry: RNR_RETRY,
        max_rd_atomic: READ_ATOMIC_DEPTH,
        ..Default::default()
    };
    [
        (
            init,
            ibv::QP_STATE | ibv::QP_PKEY_INDEX | ibv::QP_PORT | ibv::QP_ACCESS_FLAGS,
            "queue pair to INIT",
        ),
        (
            rtr,
            ibv::QP_STATE
                | ibv::QP_AV
                | ibv::QP_PATH_MTU
                | ibv::QP_DEST_QPN
                | ibv::QP_RQ_PSN
                | ibv::QP_MAX_DEST_RD_ATOMIC
                | ibv::QP_MIN_RNR_TIMER,
            "queue pair to RTR (is the peer's GID reachable?)",
        ),
        (
            rts,
            ibv::QP_STATE
                | ibv::QP_SQ_PSN
                | ibv::QP_TIMEOUT
                | ibv::QP_RETRY_CNT
                | ibv::QP_RNR_RETRY
                | ibv::QP_MAX_QP_RD_ATOMIC,
            "queue pair to RTS",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(op: Op) -> Work {
        Work {
            id: 7,
            op,
            offset: 16,
            len: 8,
            remote: 0x1000,
            rkey: 0xabc,
        }
    }

    #[test]
    fn requests_are_signalled_with_one_entry_and_the_verb_of_their_op() {
        let mut sge = ibv::Sge::default();
        let at: *mut ibv::Sge = &mut sge;
        for (op, opcode) in [
            (Op::Write, ibv::WR_RDMA_WRITE),
            (Op::Read, ibv::WR_RDMA_READ),
            (
                Op::CompareSwap {
                    compare: 1,
                    swap: 2,
                },
                ibv::WR_ATOMIC_CMP_AND_SWP,
            ),
            (Op::FetchAdd { add: 5 }, ibv::WR_ATOMIC_FETCH_AND_ADD),
        ] {
            let wr = send_wr(&work(op), at);
            assert_eq!((wr.wr_id, wr.opcode, wr.num_sge), (7, opcode, 1), "{op:?}");
            assert_eq!(wr.send_flags, ibv::SEND_SIGNALED);
            assert_eq!((wr.sg_list, wr.next), (at, null_mut()));
        }
    }

    #[test]
    fn a_post_is_one_list_each_request_with_its_own_entry() {
        let works = [
            work(Op::Read),
            work(Op::Write),
            work(Op::FetchAdd { add: 1 }),
        ];
        let mut list = Requests::default();
        // Refilled (as a queue pair does per post): the longer first list leaves nothing behind.
        list.fill(&[work(Op::Write); 5], 0, 7);
        list.fill(&works, 0x7000, 42);
        assert_eq!((list.wrs.len(), list.sges.len()), (3, 3));
        let first = list.first();
        for (i, wr) in list.wrs.iter().enumerate() {
            let next = if i + 1 < works.len() {
                first.wrapping_add(i + 1)
            } else {
                null_mut()
            };
            assert_eq!(wr.next, next, "request {i}");
            assert_eq!(wr.sg_list.cast_const(), list.sges.as_ptr().wrapping_add(i));
            let sge = list.sges[i];
            assert_eq!((sge.addr, sge.length, sge.lkey), (0x7010, 8, 42));
        }
    }

    #[test]
    fn a_partly_refused_post_counts_the_requests_before_the_refused_one() {
        let mut list = Requests::default();
        list.fill(&[work(Op::Read); 4], 0, 1);
        let first = list.first();
        assert_eq!(list.accepted_before(first.wrapping_add(2)), 2);
        assert_eq!(list.accepted_before(first.wrapping_add(3)), 3);
        assert_eq!(list.accepted_before(first), 0);
        assert_eq!(list.accepted_before(std::ptr::null()), 0);
        assert_eq!(list.accepted_before(first.wrapping_add(9)), 0);
        let odd = (first as usize + 3) as *const ibv::SendWr;
        assert_eq!(list.accepted_before(odd), 0);
    }

    #[test]
    fn the_connection_routes_over_the_peers_gid_with_the_fabrics_traffic_class() {
        let local = Local {
            port: 1,
            gid_index: 3,
            mtu: 5,
            tc: 106,
            psn: 0x1234,
        };
        let peer = QpAddress {
            gid: "::ffff:10.0.0.2".parse().unwrap(),
            qpn: 17,
            psn: 99,
            mtu: Some(4096),
        };
        let [(init, init_mask, _), (rtr, rtr_mask, _), (rts, rts_mask, _)] =
            transitions(local, peer);
        assert_eq!((init.qp_state, init.port_num), (ibv::QPS_INIT, 1));
        assert_eq!(init.qp_access_flags, 0b1110, "remote write, read, atomic");
        // Bits as verbs.h numbers them: STATE 0, ACCESS_FLAGS 3, PKEY_INDEX 4, PORT 5, AV 7,
        // PATH_MTU 8, TIMEOUT 9, RETRY_CNT 10, RNR_RETRY 11, RQ_PSN 12, MAX_QP_RD_ATOMIC 13,
        // MIN_RNR_TIMER 15, SQ_PSN 16, MAX_DEST_RD_ATOMIC 17, DEST_QPN 20.
        let bits = |b: &[u32]| b.iter().fold(0, |m, b| m | 1 << b);
        assert_eq!(init_mask, bits(&[0, 3, 4, 5]));
        let grh = rtr.ah_attr.grh;
        assert_eq!(grh.dgid.raw, peer.gid.octets());
        assert_eq!(
            (grh.sgid_index, grh.traffic_class, grh.hop_limit),
            (3, 106, 64)
        );
        assert_eq!((rtr.ah_attr.is_global, rtr.ah_attr.port_num), (1, 1));
        assert_eq!((rtr.dest_qp_num, rtr.rq_psn, rtr.path_mtu), (17, 99, 5));
        assert_eq!(rtr.max_dest_rd_atomic, 8);
        // Both ends use the smaller MTU: a peer at 1024 (or an older one, at ours).
        let at = |mtu| transitions(local, QpAddress { mtu, ..peer })[1].0.path_mtu;
        assert_eq!((at(Some(1024)), at(Some(8192)), at(None)), (3, 5, 5));
        assert_eq!(
            (mtu_bytes(1), mtu_bytes(3), mtu_bytes(5)),
            (256, 1024, 4096)
        );
        assert_eq!(rtr_mask, bits(&[0, 7, 8, 12, 15, 17, 20]));
        assert_eq!(
            (rts.qp_state, rts.sq_psn, rts.max_rd_atomic),
            (ibv::QPS_RTS, 0x1234, 8)
        );
        assert_eq!((rts.timeout, rts.retry_cnt, rts.rnr_retry), (16, 7, 7));
        assert_eq!(rts_mask, bits(&[0, 9, 10, 11, 13, 16]));
    }
}
