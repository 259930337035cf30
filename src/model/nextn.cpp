// The model's own NextN/MTP head as a draft source (DeepSeek-V3 style multi-token prediction;
// glm4moe files carry one such block after the decoder). See include/moesh/model/speculative.h.
//
// Slot c of a sequence pairs the decoder's final normed hidden state at position c with the token
// that followed it (position c + 1) and predicts the token at c + 2:
//
//   x = eh_proj · [ rmsnorm(embed(t_{c+1})) ⊙ enorm  |  rmsnorm(h_c) ⊙ hnorm ]
//   x = block(x)                  (attention over the head's own cache of slots, MoE, residuals)
//   logits = head · ( rmsnorm(x) ⊙ shared_head_norm )
//
// Drafting recurses: the next slot takes the proposed token and, standing in for the decoder's
// hidden state there, the block's own output x. Those slots are temporary (cut after proposing);
// the slots of positions the decoder kept are committed, so each step runs the head once per kept
// position plus once per further draft.
#include <algorithm>
#include <map>

#include "model/arch.h"
#include "moesh/model/sampling.h"
#include "moesh/model/speculative.h"
#include "moesh/tensor/ops.h"

namespace moesh {

namespace {
// Positions waiting for the head before they are committed without a proposal.
constexpr int64_t kMaxPending = 32;
}  // namespace

struct NextnDraft::Impl {
  const Model& model;
  HParams hp;  // the model's, with state slots for the NextN blocks (the head's own cache)
  const NextnWeights& w;
  int il;  // the block's index in the file (n_layer: the first NextN block)
  ThreadPool* pool;
  int depth;
  KvCache kv;
  std::shared_ptr<ExpertExecutor> executor;
  Context::Scratch s;
  std::vector<float> cat, x, xn, attn_out, ffn_out, row, logits;
  std::vector<int64_t> pos, cell;
  std::vector<int32_t> seqv;

  // Per sequence: the committed slots are the head's cache cells (positions base..end-1);
  // pairs reported since the last proposal wait in pend_* until the next propose().
  struct Seq {
    int64_t end = 0;  // position after the last pair reported (committed or pending)
    std::vector<int32_t> pend_tok;
    std::vector<float> pend_h;
    int64_t pend_first = 0;
    int32_t last_next = -1;     // the token that followed the last reported position
    int32_t d1 = -1;            // the committed head's proposal for the token after last_next
    bool have = false;          // last_x and d1 describe the last committed slot
    std::vector<float> last_x;  // the block's output at the last committed slot
  };
  std::map<int32_t, Seq> seqs;

  Impl(const Model& m, const NextnWeights& nw, int block, ThreadPool* p, int64_t n_ctx, int max_depth)
      : model(m),
        hp(m.hparams()),
        w(nw),
        il(block),
        pool(p),
        depth(max_depth),
        kv(1, m.hparams().kv_k_width, m.hparams().kv_v_width, n_ctx > 0 ? n_ctx : m.hparams().n_ctx_train) {
    // The block attends over layer 0 of the head's own cache.
    hp.state_slot.resize(static_cast<size_t>(il) + 1, 0);
    hp.state_slot[static_cast<size_t>(il)] = 0;
    if (!hp.recurrent.empty()) hp.recurrent.resize(static_cast<size_t>(il) + 1, 0);
    std::vector<ExpertWeights> experts(static_cast<size_t>(il) + 1);
    experts[static_cast<size_t>(il)] = w.block.experts;
    executor = std::make_shared<LocalExecutor>(std::move(experts), pool);
  }

  // Runs n slots of `seq` at positions p0.. (appended to its cells); leaves the block outputs
  // (pre-norm) in x and, for the last slot, the head's argmax in *next.
  Status run(int32_t seq, int64_t p0, int64_t n, const int32_t* toks, const float* hid, int32_t* next) {
    const int64_t D = hp.n_embd;
    const size_t nd = static_cast<size_t>(n * D);
    float* c = detail::grow(cat, nd * 2);
    float* e = detail::grow(row, static_cast<size_t>(D));
    for (int64_t i = 0; i < n; ++i) {
      get_row_f32(w.embed, toks[i], e);
      detail::rms_norm_rows(e, w.enorm, c + i * 2 * D, 1, D, hp.rms_eps);
      detail::rms_norm_rows(hid + i * D, w.hnorm, c + i * 2 * D + D, 1, D, hp.rms_eps);
    }
    const int64_t n_before = kv.seq_len(seq);
    int64_t* pp = detail::grow(pos, static_cast<size_t>(n));
    int64_t* pc = detail::grow(cell, static_cast<size_t>(n));
    int32_t* ps = detail::grow(seqv, static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pp[i] = p0 + i, pc[i] = n_before + i, ps[i] = seq;
    MOESH_RETURN_IF_ERROR(kv.append(seq, pp, n).status());
    detail::Fwd f{model, hp, pool, kv, nullptr, s, *executor, nullptr, detail::Batch{n, ps, pp, pc}};
    detail::BlockBufs b{detail::grow(x, nd), detail::grow(xn, nd), detail::grow(attn_out, nd),
                        detail::grow(ffn_out, nd)};
    detail::project(f, c, n, 2 * D, {{&w.eh_proj, b.h}});
    detail::MoeCall call;
    Status st = detail::block_begin(f, il, w.block, b, &call);
    if (st.is_ok()) st = detail::block_end(f, il, w.block, b, &call);
    if (!st.is_ok()) {
      (void)kv.truncate(seq, n_before);
      return st;
    }
    // The head on the last slot only: that is the one proposal this run makes.
    float* hn = detail::grow(xn, nd);
    detail::rms_norm_rows(b.h + (n - 1) * D, w.head_norm, hn, 1, D, hp.rms_eps);
    float* lg = detail::grow(logits, static_cast<size_t>(hp.n_vocab));
    detail::project(f, hn, 1, D, {{&w.head, lg}});
    *next = argmax(lg, hp.n_vocab);
    return Status::ok();
  }

  // Commits the pending pairs of `st` (one run), so d1/last_x describe the newest slot.
  Status commit(int32_t seq, Seq& st) {
    const int64_t n = static_cast<int64_t>(st.pend_tok.size());
    if (n == 0) return Status::ok();
    int32_t d = -1;
    Status r = run(seq, st.pend_first, n, st.pend_tok.data(), st.pend_h.data(), &d);
    const int64_t D = hp.n_embd;
    st.pend_tok.clear();
    st.pend_h.clear();
    if (!r.is_ok()) {  // the pairs are lost: restart the head's state after them
      kv.remove(seq);
      st.have = false;
      return r;
    }
    st.last_x.assign(x.begin() + (n - 1) * D, x.begin() + n * D);
    st.d1 = d;
    st.have = true;
    return Status::ok();
  }
};

NextnDraft::NextnDraft(const Model& model, ThreadPool* pool, int64_t n_ctx, int max_depth)
    : impl_(std::make_unique<Impl>(model, model.nextn.front(), static_cast<int>(model.hparams().n_layer), pool, n_ctx,
                                   std::max(1, max_depth))) {}

NextnDraft::~NextnDraft() = default;

void NextnDraft::on_hidden(int32_t seq, int64_t first, int64_t n, const float* rows, const int32_t* next) {
  if (n <= 0) return;
  Impl& m = *impl_;
  Impl::Seq& st = m.seqs[seq];
  const int64_t D = m.hp.n_embd;
  const int64_t committed = m.kv.seq_len(seq);
  if (first < st.end) {
    // Positions reported again (a slot reused for a prompt sharing a prefix): the slots from
    // first - 1 on go, since slot first - 1 paired its hidden state with the token that used to
    // follow it. The head's cache keeps a hole there; attention simply does not see that slot.
    const int64_t cut = first - 1;
    st.pend_tok.clear();  // pending pairs are contiguous: those before the cut go too
    st.pend_h.clear();
    if (committed > 0) {
      const int64_t* p = m.kv.positions(seq);
      (void)m.kv.truncate(seq, std::lower_bound(p, p + committed, cut) - p);
    }
    st.have = false;
    st.pend_first = first;
  } else if (first > st.end) {
    // A gap (the decoder's cells before `first` came from elsewhere): the head starts over
    // there and attends over what it sees from now on.
    m.kv.remove(seq);
    st.pend_tok.clear();
    st.pend_h.clear();
    st.pend_first = first;
    st.have = false;
  } else if (st.pend_tok.empty()) {
    st.pend_first = first;
  }
  st.pend_tok.insert(st.pend_tok.end(), next, next + n);
  st.pend_h.insert(st.pend_h.end(), rows, rows + n * D);
  st.end = first + n;
  st.last_next = next[n - 1];
  // While nothing is drafted (the cost model said no) the pairs are committed in batches, so
  // the backlog stays bounded and the head is ready when drafting pays again.
  if (static_cast<int64_t>(st.pend_tok.size()) >= kMaxPending) {
    Status r = m.commit(seq, st);
    if (!r.is_ok()) {
      ++stats_.failures;
      last_error_ = r;
    }
  }
}

void NextnDraft::forget(int32_t seq) {
  impl_->kv.remove(seq);
  impl_->seqs.erase(seq);
}

void NextnDraft::propose(int32_t seq, std::span<const int32_t> history, int max_tokens, std::vector<int32_t>* out) {
  out->clear();
  Impl& m = *impl_;
  auto it = m.seqs.find(seq);
  if (max_tokens <= 0 || it == m.seqs.end() || history.empty()) return;
  Impl::Seq& st = it->second;
  // The head drafts from the newest position only: its pair must end with the history's last token.
  if (st.last_next != history.back()) return;
  Status r = m.commit(seq, st);
  if (!r.is_ok()) {
    ++stats_.failures;
    last_error_ = r;
    return;
  }
  if (!st.have || st.d1 < 0) return;
  ++stats_.runs;
  out->push_back(st.d1);
  const int n = std::min(max_tokens, m.depth);
  if (n == 1) return;
  // Further drafts on temporary slots, cut afterwards.
  const int64_t D = m.hp.n_embd;
  const int64_t keep = m.kv.seq_len(seq);
  std::vector<float> h = st.last_x;
  for (int i = 1; i < n; ++i) {
    int32_t d = -1;
    const int32_t tok = (*out)[static_cast<size_t>(i - 1)];
    r = m.run(seq, st.end + i - 1, 1, &tok, h.data(), &d);
    if (!r.is_ok()) {
      ++stats_.failures;
      last_error_ = r;
      break;
    }
    ++stats_.runs;
    out->push_back(d);
    h.assign(m.x.begin(), m.x.begin() + D);
  }
  (void)m.kv.truncate(seq, keep);
}

Result<std::unique_ptr<DraftSource>> make_nextn_draft(const DraftEnv& env) {
  if (env.model == nullptr || env.pool == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "draft source 'nextn' needs the model it drafts for");
  }
  const Model& m = *env.model;
  const HParams& hp = m.hparams();
  if (!m.nextn_status.is_ok()) {
    return make_error(StatusCode::kUnsupported,
                      "draft source 'nextn': the NextN/MTP block of this {} model cannot run: {}", hp.arch_name,
                      m.nextn_status.message());
  }
  if (m.nextn.empty()) {
    return make_error(
        StatusCode::kUnsupported,
        "draft source 'nextn': this {} model has no NextN/MTP block it can run ({}.nextn_predict_layers = "
        "{}; the head runs for: {})",
        hp.arch_name, hp.arch_name, hp.n_nextn, fmt::join(nextn_architectures(), ", "));
  }
  const ExpertWeights& e = m.nextn.front().block.experts;
  if (m.nextn.front().block.is_moe && !(e.gate.valid() && e.up.valid() && e.down.valid())) {
    return make_error(StatusCode::kUnsupported,
                      "draft source 'nextn': the routed experts of the NextN block (blk.{}) are not in this file; the "
                      "head runs on the backbone, so cut the backbone slice with this moesh (it keeps them)",
                      hp.n_layer);
  }
  return std::unique_ptr<DraftSource>(std::make_unique<NextnDraft>(m, env.pool, env.n_ctx, env.nextn_depth));
}

}  // namespace moesh
