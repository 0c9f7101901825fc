#include "trident/model/layers/context_parallel.h"

#include <array>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/error.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/flash_attention_block.h"

namespace trident::model::layers {

namespace k = trident::kernels;

namespace {

// Views of chunk-major buffers: blocks of (B, Tc) rows (block b of a buffer starts b x B x Tc
// rows in), `heads` heads of HS per row. The ring's blocks are this rank's two halves; Ulysses'
// are the 2U halves of the whole sequence.
struct Chunks {
  const LayerContext& lc;
  int size, rank;  // the cp group
  std::int64_t B, Tc, heads, HS;

  Chunks(const LayerContext& c, std::int64_t num_heads, std::int64_t head_dim)
      : lc(c),
        size(c.cp->size()),
        rank(c.cp->rank()),
        B(c.batch),
        Tc(c.seq_len / 2),
        heads(num_heads),
        HS(head_dim) {}

  // Rows (B, Tc, heads, w HS) of block b of a buffer of w slots per head (3: qkv, 2: kv).
  core::TensorView slots(const float* base, int b, std::int64_t w) const {
    return view_of(lc, base + b * B * Tc * heads * w * HS, {B, Tc, heads, w * HS});
  }
  core::TensorView qkv(const float* base, int b) const { return slots(base, b, 3); }
  core::TensorView kv(const float* base, int b) const { return slots(base, b, 2); }
  core::TensorView out(const float* base, int b) const {
    return view_of(lc, base + b * B * Tc * heads * HS, {B, Tc, heads * HS});
  }
  core::TensorView lse(const float* base, int b) const {
    return view_of(lc, base + b * B * heads * Tc, {B, heads, Tc});
  }
  // Global positions of sequence chunk `chunk`.
  core::TensorView pos(std::int64_t chunk) const {
    return view_of(lc, lc.cp_positions + chunk * Tc, {Tc});
  }
  // One visible (query block b, key block) pair of v into block b of out and lse: a query block's
  // first pair writes them, later ones go through the workspace's block buffers and are merged
  // in by log-sum-exp.
  void attend(float* out_base, float* lse_base, int b, bool first,
              k::FlashAttentionBlockViews v) const {
    const Workspace& ws = lc.ws;
    v.out = first ? out(out_base, b) : out(ws.cp_out_blk, 0);
    v.lse = first ? lse(lse_base, b) : lse(ws.cp_lse_blk, 0);
    k::flash_attention_block(lc.ctx, v);
    if (first) return;
    k::flash_attention_merge(lc.ctx, {.out = out(out_base, b),
                                      .lse = lse(lse_base, b),
                                      .out_blk = out(ws.cp_out_blk, 0),
                                      .lse_blk = lse(ws.cp_lse_blk, 0)});
  }
};

// The ring: this rank's two halves and the visiting block's. A block travels as keys and values
// only (B*Tl, NH, 2 HS), two thirds of the qkv rows.
struct Ring : Chunks {
  int next, prev;
  std::int64_t NH;
  std::int64_t rows() const { return 2 * B * Tc; }
  std::int64_t kv_all() const { return rows() * NH * 2 * HS; }  // floats of a block

  Ring(const LayerContext& c, std::int64_t nh, std::int64_t hs)
      : Chunks(c, nh, hs), next((rank + 1) % size), prev((rank + size - 1) % size), NH(nh) {}

  std::int64_t chunk(int owner, int h) const { return cp_chunk(size, owner, h); }
  // The block held at step s came from this rank.
  int owner_at(int s) const { return (rank - s + size) % size; }

  // Each head's key and value (slots 1, 2 of its 3) between qkv rows and kv rows.
  void pack_kv(const float* qkv, float* kv) const { move_kv(qkv, 3, 1, kv, 2, 0); }
  void unpack_kv(const float* kv, float* qkv) const { move_kv(kv, 2, 0, qkv, 3, 1); }
  void move_kv(const float* in, std::int64_t in_w, std::int64_t in_slot, float* out,
               std::int64_t out_w, std::int64_t out_slot) const {
    for (std::int64_t h = 0; h < NH; ++h) {
      k::copy_columns(lc.ctx, {.out = view_of(lc, out, {rows(), NH * out_w * HS}),
                               .in = view_of(lc, in, {rows(), NH * in_w * HS}),
                               .out_col = (h * out_w + out_slot) * HS,
                               .in_col = (h * in_w + in_slot) * HS,
                               .cols = 2 * HS});
    }
  }
};

// Starts the block's move one step along the ring: send `from` to the next rank, receive the
// previous rank's into `into`.
std::array<comm::Request, 2> pass_on(const Ring& r, const float* from, float* into) {
  comm::Communicator& cp = *r.lc.cp;
  return {cp.isend(from, r.kv_all(), comm::Datatype::kF32, r.next),
          cp.irecv(into, r.kv_all(), comm::Datatype::kF32, r.prev)};
}

void finish(std::array<comm::Request, 2>& reqs) {
  for (comm::Request& q : reqs) q.wait();
}

}  // namespace

// The travelling blocks: this rank's own keys and values are packed into cp_kv[1]; at step s the
// block held is sent on and the next one received into cp_kv[s % 2] (the buffer of the block
// two steps back, whose send has completed).
void ring_attention_forward(const LayerContext& lc, const RingAttentionArgs& a) {
  const Ring r(lc, a.num_heads, a.head_dim);
  const Workspace& ws = lc.ws;
  const std::int64_t T = lc.total_len();
  const core::TensorView slopes = view_of(lc, a.alibi, {r.NH});
  bool started[2] = {false, false};
  r.pack_kv(a.qkv, ws.cp_kv[1]);
  const float* kv = ws.cp_kv[1];
  for (int s = 0; s < r.size; ++s) {
    std::array<comm::Request, 2> moving{};
    float* incoming = ws.cp_kv[s % 2];
    if (s + 1 < r.size) moving = pass_on(r, kv, incoming);
    const int owner = r.owner_at(s);
    for (int hq = 0; hq < 2; ++hq) {
      const std::int64_t qc = r.chunk(r.rank, hq);
      for (int hk = 0; hk < 2; ++hk) {
        const std::int64_t kc = r.chunk(owner, hk);
        if (kc > qc) continue;  // every key of the chunk is after every query: nothing visible
        // A chunk's first pair is its diagonal, at step 0.
        const bool first = !started[hq];
        started[hq] = true;
        r.attend(a.attn, a.lse, hq, first,
                 {.qkv = r.qkv(a.qkv, hq),
                  .kv = r.kv(kv, hk),
                  .q_pos = r.pos(qc),
                  .k_pos = r.pos(kc),
                  .alibi = slopes,
                  .dropout = a.dropout,
                  .total_len = T});
      }
    }
    finish(moving);
    kv = incoming;
  }
}

// The query gradients accumulate in d_qkv's query slots; each block's key and value gradients in
// a buffer that travels with it (cp_dkv) and is back at its owner after the last step, which
// unpacks it into d_qkv's key and value slots.
void ring_attention_backward(const LayerContext& lc, const RingAttentionBackwardArgs& b) {
  const RingAttentionArgs& a = b.fwd;
  const Ring r(lc, a.num_heads, a.head_dim);
  const Workspace& ws = lc.ws;
  const std::int64_t T = lc.total_len();
  const core::TensorView slopes = view_of(lc, a.alibi, {r.NH});
  k::fill(lc.ctx, {.out = view_of(lc, b.d_qkv, {r.rows() * r.NH * 3 * r.HS})});
  k::fill(lc.ctx, {.out = view_of(lc, ws.cp_dkv[0], {r.kv_all()})});
  r.pack_kv(a.qkv, ws.cp_kv[1]);
  const float* kv = ws.cp_kv[1];
  float* dkv = ws.cp_dkv[0];
  for (int s = 0; s < r.size; ++s) {
    std::array<comm::Request, 2> moving{};
    float* incoming = ws.cp_kv[s % 2];
    if (s + 1 < r.size) moving = pass_on(r, kv, incoming);
    const int owner = r.owner_at(s);
    for (int hq = 0; hq < 2; ++hq) {
      const std::int64_t qc = r.chunk(r.rank, hq);
      for (int hk = 0; hk < 2; ++hk) {
        const std::int64_t kc = r.chunk(owner, hk);
        if (kc > qc) continue;
        k::flash_attention_block_backward(lc.ctx, {.d_qkv = r.qkv(b.d_qkv, hq),
                                                   .d_kv = r.kv(dkv, hk),
                                                   .accumulate_dkv = true,
                                                   .d_out = r.out(b.d_attn, hq),
                                                   .out = r.out(a.attn, hq),
                                                   .lse = r.lse(a.lse, hq),
                                                   .qkv = r.qkv(a.qkv, hq),
                                                   .kv = r.kv(kv, hk),
                                                   .q_pos = r.pos(qc),
                                                   .k_pos = r.pos(kc),
                                                   .alibi = slopes,
                                                   .dropout = a.dropout,
                                                   .total_len = T});
      }
    }
    finish(moving);
    kv = incoming;
    // The block's gradients follow it (after the last step they return to their owner).
    float* dkv_in = ws.cp_dkv[(s + 1) % 2];
    std::array<comm::Request, 2> grads = pass_on(r, dkv, dkv_in);
    finish(grads);
    dkv = dkv_in;
  }
  r.unpack_kv(dkv, b.d_qkv);
}

namespace {

// Ulysses' geometry: the U ranks of the group, NHu = NH / U of the tp rank's NH heads each. The
// whole sequence for a rank's heads is 2U blocks (rank j's half h is block 2j + h) of
// (B, Tc, NHu, w) elements, w = 3 HS for qkv and HS for the output.
struct Heads : Chunks {
  std::int64_t BT, NH, NHu;

  Heads(const LayerContext& c, std::int64_t nh, std::int64_t hs)
      : Chunks(c, nh / c.cp->size(), hs), BT(c.batch * c.seq_len), NH(nh), NHu(nh / c.cp->size()) {
    // TrainConfig refuses such a split; a direct caller of the model gets this, not truncation.
    TRIDENT_CHECK(nh % c.cp->size() == 0, "Ulysses: ", nh,
                  " heads on this tensor-parallel rank do ", "not divide over ", c.cp->size(),
                  " sequence-parallel ranks");
  }

  int blocks() const { return 2 * size; }
  std::int64_t chunk(int block) const { return cp_chunk(size, block / 2, block % 2); }

  // rows (B*Tl, NH w), every head of this rank's rows -> heads: U blocks of (B*Tl, NHu w), block
  // j rank j's rows of this rank's heads (packed through send, then one all-to-all).
  void rows_to_heads(const float* rows, float* send, float* by_head, std::int64_t w) const {
    const std::int64_t cols = NHu * w;
    for (int j = 0; j < size; ++j) {
      k::copy_columns(lc.ctx, {.out = view_of(lc, send + j * BT * cols, {BT, cols}),
                               .in = view_of(lc, rows, {BT, NH * w}),
                               .in_col = j * cols,
                               .cols = cols});
    }
    exchange(send, by_head, BT * cols);
  }
  // The reverse: heads -> (through recv) rows.
  void heads_to_rows(const float* by_head, float* recv, float* rows, std::int64_t w) const {
    const std::int64_t cols = NHu * w;
    exchange(by_head, recv, BT * cols);
    for (int j = 0; j < size; ++j) {
      k::copy_columns(lc.ctx, {.out = view_of(lc, rows, {BT, NH * w}),
                               .in = view_of(lc, recv + j * BT * cols, {BT, cols}),
                               .out_col = j * cols,
                               .cols = cols});
    }
  }
  void exchange(const float* in, float* out, std::int64_t block) const {
    const std::vector<std::int64_t> counts(static_cast<std::size_t>(size), block);
    lc.cp->all_to_all_v(in, counts, out, counts, comm::Datatype::kF32);
  }

  // This rank's heads' slopes and dropout keys.
  core::TensorView slopes(const float* alibi) const {
    return view_of(lc, alibi == nullptr ? nullptr : alibi + rank * NHu, {NHu});
  }
  k::AttentionDropout dropout(k::AttentionDropout d) const {
    d.head_offset += rank * NHu;
    return d;
  }
};

}  // namespace

void ulysses_attention_forward(const LayerContext& lc, const UlyssesArgs& a) {
  const Heads g(lc, a.num_heads, a.head_dim);
  const Workspace& ws = lc.ws;
  g.rows_to_heads(a.local_qkv, ws.sp_send, a.qkv, 3 * g.HS);
  for (int bq = 0; bq < g.blocks(); ++bq) {
    const std::int64_t qc = g.chunk(bq);
    bool first = true;
    for (int bk = 0; bk < g.blocks(); ++bk) {
      const std::int64_t kc = g.chunk(bk);
      if (kc > qc) continue;  // all of its keys come after all of the queries
      g.attend(a.out, a.lse, bq, first,
               {.qkv = g.qkv(a.qkv, bq),
                .kv = g.qkv(a.qkv, bk),
                .q_pos = g.pos(qc),
                .k_pos = g.pos(kc),
                .alibi = g.slopes(a.alibi),
                .dropout = g.dropout(a.dropout),
                .total_len = lc.total_len()});
      first = false;
    }
  }
  g.heads_to_rows(a.out, ws.sp_send, a.attn, g.HS);
}

void ulysses_attention_backward(const LayerContext& lc, const UlyssesBackwardArgs& b) {
  const UlyssesArgs& a = b.fwd;
  const Heads g(lc, a.num_heads, a.head_dim);
  const Workspace& ws = lc.ws;
  g.rows_to_heads(b.d_attn, ws.sp_send, ws.sp_dout, g.HS);
  k::fill(lc.ctx, {.out = view_of(lc, ws.sp_dqkv, {g.BT * g.NH * 3 * g.HS})});
  for (int bq = 0; bq < g.blocks(); ++bq) {
    const std::int64_t qc = g.chunk(bq);
    for (int bk = 0; bk < g.blocks(); ++bk) {
      const std::int64_t kc = g.chunk(bk);
      if (kc > qc) continue;
      k::flash_attention_block_backward(lc.ctx, {.d_qkv = g.qkv(ws.sp_dqkv, bq),
                                                 .d_kv = g.qkv(ws.sp_dqkv, bk),
                                                 .accumulate_dkv = true,
                                                 .d_out = g.out(ws.sp_dout, bq),
                                                 .out = g.out(a.out, bq),
                                                 .lse = g.lse(a.lse, bq),
                                                 .qkv = g.qkv(a.qkv, bq),
                                                 .kv = g.qkv(a.qkv, bk),
                                                 .q_pos = g.pos(qc),
                                                 .k_pos = g.pos(kc),
                                                 .alibi = g.slopes(a.alibi),
                                                 .dropout = g.dropout(a.dropout),
                                                 .total_len = lc.total_len()});
    }
  }
  g.heads_to_rows(ws.sp_dqkv, ws.sp_send, b.d_qkv, 3 * g.HS);
}

}  // namespace trident::model::layers
