// The op interface every backend implements (ARCHITECTURE rules 1-3). The model calls only these.
// Each op documents shapes, dtypes and aliasing; the CPU backend is the executable specification.
// A backend is a complete set of ops: every method is pure virtual, so a backend that misses one
// cannot be instantiated (a build failure, never a runtime "op not found").
//
// Conventions: T = tokens in the step (all sequences flattened), S = sequences, H = heads local to
// this rank, V = vocabulary rows held by this rank. Activations are F32 on the CPU backend (other
// backends may also accept BF16 where documented). "[T, D] strided" means rows may have any
// stride but the last dim is contiguous.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "core/tensor.h"
#include "ops/weight.h"

namespace mla::ops {

// RoPE frequencies for the rotated dims of q and k. Pair i is rotated by angle pos * inv_freq[i].
// Interleaved (DeepSeek/Kimi checkpoints): pair i is (x[2i], x[2i+1]). Otherwise Llama's
// "rotate_half" layout (EAGLE-3 drafts): pair i is (x[i], x[i + rope_dim/2]).
struct RopeTable {
  TensorView inv_freq;           // F32 [rope_dim / 2], in backend memory (YaRN already applied)
  float attention_factor = 1.0f;  // multiplies cos and sin (YaRN m(s,mscale)/m(s,mscale_all_dim))
  bool interleaved = true;        // pair layout, see above
};

// Head geometry of one MLA layer on this rank.
struct MlaDims {
  int num_heads = 0;         // H: query heads on this rank
  int qk_nope_head_dim = 0;  // d_n
  int qk_rope_head_dim = 0;  // d_r
  int v_head_dim = 0;        // d_v
  int kv_lora_rank = 0;      // r
  float softmax_scale = 0;   // applied to q.k before softmax (includes YaRN mscale^2)
  int kv_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

// Head geometry of one GQA (Llama-style) attention layer: num_heads query heads share
// num_kv_heads K/V heads in groups of num_heads / num_kv_heads consecutive query heads.
struct GqaDims {
  int num_heads = 0;        // H
  int num_kv_heads = 0;     // KVH, divides H
  int head_dim = 0;         // D
  float softmax_scale = 0;  // applied to q.k before softmax (D^-1/2 for Llama)
  int64_t cache_row_width() const { return int64_t(2) * num_kv_heads * head_dim; }
};

// Where each sequence's tokens and cache live for one forward step; shared by all layers.
// The cache of a layer is [num_blocks, block_size, kv_dim]; slot = block_id * block_size + offset.
// Invariant: the new tokens of sequence s occupy absolute positions [kv_len - q_len, kv_len), and a
// query at absolute position p attends to cache positions [0, p] (causal).
struct AttentionBatch {
  int num_seqs = 0;          // S
  int block_size = 0;        // tokens per cache block
  TensorView q_indptr;       // I32 [S+1]: the query rows of seq s are [q_indptr[s], q_indptr[s+1])
  TensorView kv_lens;        // I32 [S]: cached tokens of seq s after this step's writes
  TensorView block_indptr;   // I32 [S+1]: blocks of seq s are block_ids[block_indptr[s] ..)
  TensorView block_ids;      // I32 [total blocks]
  TensorView slot_mapping;   // I32 [T]: cache slot written by each new token
  // Host mirrors of q_indptr / kv_lens / block_indptr / block_ids for backends that plan on the host
  // (always host memory, same contents).
  std::span<const int32_t> host_q_indptr, host_kv_lens, host_block_indptr, host_block_ids;
};

// DeepSeek-V3 router parameters (sigmoid scoring, noaux_tc).
struct MoeRouting {
  int top_k = 0;                       // num_experts_per_tok
  int n_group = 1;                     // expert groups (contiguous ranges of experts)
  int topk_group = 1;                  // groups kept per token
  bool norm_topk_prob = true;          // renormalize the k selected weights to sum to 1
  float routed_scaling_factor = 1.0f;  // multiplies the final routed weights
};

// One routed or shared expert: down(silu(gate x) * up x).
struct ExpertWeights {
  Weight gate_proj;  // [I, hidden]
  Weight up_proj;    // [I, hidden]
  Weight down_proj;  // [hidden, I]
};

// A recorded, replayable sequence of ops (a CUDA/HIP graph on GPUs). Replay re-issues the same
// kernels on the same buffers; between replays callers change only the contents of those buffers.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- memory (start-up only; never on the hot path) -------------------------------------------
  // Zero-filled device memory.
  virtual Buffer alloc(size_t bytes) = 0;
  // Makes a host tensor (e.g. an mmapped checkpoint tensor) usable by ops. The CPU backend returns
  // the same view (zero copy); device backends copy it into memory they own for their lifetime.
  virtual TensorView place_weight(const TensorView& host) = 0;
  // dst (backend memory, contiguous) <- src (host, same bytes).
  virtual void copy_from_host(const TensorView& dst, const void* src) = 0;
  // dst (host) <- src (backend memory, contiguous).
  virtual void copy_to_host(void* dst, const TensorView& src) = 0;
  virtual void synchronize() = 0;

  // ---- step graphs (ARCHITECTURE rule 4) ---------------------------------------------------------
  // Records the ops `record` issues into a graph; nothing runs until replay(). A backend without graphs returns one that calls
  // `record` again on each replay (same results, no speed-up), so callers need no special case.
  // Preconditions: `record` does not allocate and does not copy to or from the host; the ops it
  // issues have run eagerly at least once with the same shapes (so grow-once scratch is sized).
  virtual std::unique_ptr<OpGraph> capture(const std::function<void()>& record) = 0;

  // ---- elementwise and normalization ------------------------------------------------------------
  // out[t,:] = table[ids[t], :]. ids I32 [T]; table [V, D] BF16/F32; out F32 [T, D].
  // Precondition: 0 <= ids[t] < V (checked). Also the row gather of activations (F32 table).
  virtual void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) = 0;
  // out = weight * x / sqrt(mean(x^2) + eps) per row, statistics in fp32. x, out F32 [T, D]
  // strided; weight [D] BF16/F32. out may alias x.
  virtual void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) = 0;
  // residual += x; out = rms_norm(residual). residual, x, out F32 [T, D]. out may alias x.
  virtual void add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                            const TensorView& out) = 0;
  // dst = src, elementwise. F32 or I32 (the same for both: a bit copy of 4-byte elements), same
  // shape, any strides (inner dims may be strided too); must not overlap unless identical.
  virtual void copy(const TensorView& src, const TensorView& dst) = 0;
  // out = a + b. F32, same shape; out may alias a or b.
  virtual void add(const TensorView& a, const TensorView& b, const TensorView& out) = 0;
  // out = silu(gate) * up. F32 [T, I] strided; out may alias gate.
  virtual void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out) = 0;
  // In place: rotates each pair (x[t, h, a], x[t, h, b]) of pair i by angle positions[t] * inv_freq[i]
  // (angle in fp32): a' = a c - b s, b' = b c + a s, cos/sin scaled by rope.attention_factor; pair i
  // is (2i, 2i+1) when rope.interleaved, else (i, i + rope_dim/2). x F32 [T, n, rope_dim] with inner
  // dim contiguous (rows and heads may be strided); positions I32 [T].
  virtual void rope(const TensorView& x, const TensorView& positions, const RopeTable& rope) = 0;

  // ---- GEMM -------------------------------------------------------------------------------------
  // out = x W^T. x F32 [T, in] strided; out F32 [T, out] strided, must not alias x.
  // Any WeightFormat; dequantization happens inside (no whole-weight inflation).
  virtual void linear(const TensorView& x, const Weight& w, const TensorView& out) = 0;
  // out[i] = x w[i]^T for every i: several weights of one input (q_a + kv_a, gate + up), each pair
  // under linear's contract; w.size() == out.size() <= kMaxLinearGroup, no out aliasing x or
  // another out. A backend may run the group as one pass over x whose work spans every weight's
  // rows (narrow weights alone cannot fill a GPU); each out[i] then equals linear(x, *w[i])'s up
  // to the order of its K sums, which depends on the group's shapes only (never on the batch).
  static constexpr size_t kMaxLinearGroup = 4;
  virtual void linear_group(const TensorView& x, std::span<const Weight* const> w,
                            std::span<const TensorView> out) = 0;

  // ---- MLA attention over the paged latent cache ------------------------------------------------
  // cache[slot_mapping[t], :] = latent[t, :]. latent F32 [T, kv_dim] strided (rows = [c_kv | k_rope],
  // k_rope already rotated); cache contiguous F32 or BF16 [num_blocks, block_size, kv_dim]. A BF16
  // cache stores f32_to_bf16(latent) (round to nearest even); both attention forms below read any
  // cache row as bf16 -> f32 (exact), then compute in fp32.
  virtual void kv_cache_write(const TensorView& latent, const TensorView& slot_mapping, const TensorView& cache) = 0;
  // Naive (decompressed) MLA: for each cached token, k_nope[h] = W_UK[h] c and v[h] = W_UV[h] c with
  // kv_b_proj [H*(d_n+d_v), r] (per head: d_n rows W_UK then d_v rows W_UV); key = [k_nope | k_rope].
  // out[t,h,:] = sum_j softmax_j(scale * q[t,h,:].key_j) v_j[h], causal per AttentionBatch, fp32.
  // q F32 [T, H, d_n+d_r] (rope applied); out F32 [T, H, d_v].
  virtual void mla_attention_naive(const TensorView& q, const TensorView& cache, const Weight& kv_b_proj,
                                   const AttentionBatch& batch, const MlaDims& dims, const TensorView& out) = 0;
  // Absorption of W_UK into the query: out[t,h,:] = W_UK[h]^T q_nope[t,h,:].
  // q_nope F32 [T, H, d_n] strided; out F32 [T, H, r] strided (may be a slice of a wider buffer).
  virtual void mla_absorb_q(const TensorView& q_nope, const Weight& kv_b_proj, const MlaDims& dims,
                            const TensorView& out) = 0;
  // Absorbed MLA (MQA over the latent): one shared KV head, key = cache row [c | k_rope] (kv_dim),
  // value = c (first r). q F32 [T, H, kv_dim] = [W_UK^T q_nope | q_rope]; out F32 [T, H, r].
  virtual void mla_attention_absorbed(const TensorView& q, const TensorView& cache, const AttentionBatch& batch,
                                      const MlaDims& dims, const TensorView& out) = 0;
  // out[t,h,:] = W_UV[h] o_latent[t,h,:]. o_latent F32 [T, H, r]; out F32 [T, H, d_v].
  virtual void mla_expand_v(const TensorView& o_latent, const Weight& kv_b_proj, const MlaDims& dims,
                            const TensorView& out) = 0;

  // ---- GQA attention over a paged K/V cache (Llama-style draft heads, e.g. EAGLE-3) ---------------
  // A layer's cache is [num_blocks, block_size, 2 * KVH * D], F32 or BF16, contiguous; a slot's row is
  // the token's k heads then its v heads ([k_0 .. k_{KVH-1} | v_0 .. v_{KVH-1}], D values each).
  // Slots as in AttentionBatch. A BF16 cache stores f32_to_bf16 (round to nearest even), read back
  // exactly, as kv_cache_write.
  // cache[slot_mapping[t]] = [k[t, :] | v[t, :]]. k, v F32 [T, KVH*D] strided rows.
  virtual void gqa_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                               const TensorView& cache) = 0;
  // out[t, h*D:(h+1)*D] = sum_j softmax_j(scale * q[t,h,:] . k_j[g]) v_j[g], g = h / (H / KVH),
  // causal per AttentionBatch, fp32. q F32 [T, H*D] strided rows (RoPE applied); out F32 [T, H*D]
  // strided rows, must not alias q. H % KVH == 0.
  virtual void gqa_attention(const TensorView& q, const TensorView& cache, const AttentionBatch& batch,
                             const GqaDims& dims, const TensorView& out) = 0;
  // out[n, index[d]] = src[n, d] for d < Dv; every other column of out = fill (e.g. -inf: a reduced
  // draft vocabulary mapped to the target's). src F32 [N, Dv] strided rows; index I32 [Dv], entries
  // distinct and in [0, V) (the CPU checks the range; the GPU skips entries outside it); out F32
  // [N, V] strided rows, must not alias src.
  virtual void scatter_columns(const TensorView& src, const TensorView& index, float fill,
                               const TensorView& out) = 0;

  // ---- MoE --------------------------------------------------------------------------------------
  // DeepSeek-V3 noaux_tc routing. router_logits F32 [T, E]; bias F32 [E] or empty.
  // s = sigmoid(logits); b = s + bias (selection only); with n_group > 1, group score = sum of the
  // group's top-2 b, the best topk_group groups are kept and other experts excluded (-inf);
  // ids = top_k of b (descending); w = s[ids], renormalized by (sum + 1e-20) if norm_topk_prob,
  // times routed_scaling_factor. topk_ids I32 [T, k]; topk_weights F32 [T, k].
  virtual void moe_route(const TensorView& router_logits, const TensorView& bias, const MoeRouting& routing,
                         const TensorView& topk_ids, const TensorView& topk_weights) = 0;
  // out[t] = sum_k topk_weights[t,k] * expert(topk_ids[t,k])(x[t]), accumulated in fp32.
  // x F32 [T, hidden]; out F32 [T, hidden], must not alias x. experts[e] is the weight set of global
  // expert e; an expert with empty weights is not held by this rank and contributes 0, and so does
  // an id outside [0, E) (a device backend cannot raise an error from inside the step without a host
  // synchronisation, and expert parallelism marks experts routed elsewhere that way). A token that
  // names one expert twice gets that expert's output once per slot, with each slot's weight.
  virtual void moe_experts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                           std::span<const ExpertWeights> experts, const TensorView& out) = 0;

  // ---- sampling (rows are independent; B = rows) ------------------------------------------------
  // probs = softmax(logits / temperature[b]) per row, fp32. temperature F32 [B] > 0.
  virtual void softmax(const TensorView& logits, const TensorView& temperature, const TensorView& probs) = 0;
  // Keeps every p >= the k-th largest of the row (ties at the pivot all kept), zeroes the rest and
  // renormalizes. top_k I32 [B]; k <= 0 or k >= V keeps the row unchanged. probs/out F32 [B, V];
  // out may alias probs.
  virtual void top_k_renorm_prob(const TensorView& probs, const TensorView& top_k, const TensorView& out) = 0;
  // Keeps the smallest set of largest probabilities whose sum reaches top_p[b] (the boundary token is
  // kept; ties at the boundary value kept together), zeroes the rest, renormalizes. top_p F32 [B] in
  // (0, 1]; 1 keeps the row unchanged.
  virtual void top_p_renorm_prob(const TensorView& probs, const TensorView& top_p, const TensorView& out) = 0;
  // Keeps p >= min_p[b] * max(p), renormalizes. min_p F32 [B] in [0, 1]; 0 keeps the row unchanged.
  virtual void min_p_renorm_prob(const TensorView& probs, const TensorView& min_p, const TensorView& out) = 0;
  // out_ids[b] = smallest i with cumsum(probs[b])[i] > uniforms[b] * sum(probs[b]) (inverse CDF);
  // never returns a zero-probability index. uniforms F32 [B] in [0, 1); out_ids I32 [B].
  virtual void sample_from_probs(const TensorView& probs, const TensorView& uniforms, const TensorView& out_ids) = 0;
  // out_ids[b] = index of the maximum of row b (lowest index on ties). logits F32 [B, V].
  virtual void argmax(const TensorView& logits, const TensorView& out_ids) = 0;

  // ---- speculative decoding (issue #8; MODELS.md section 6) ---------------------------------------
  // Chain verification by rejection sampling, row-wise over B sequences with up to K drafts each.
  // draft_probs F32 [B, K, V]: the filtered, renormalized distribution q_i each draft token was drawn
  // from; draft_ids I32 [B, K]; num_drafts I32 [B] in [0, K] (draft slots >= num_drafts[b] unused);
  // target_probs F32 [B, K+1, V]: the target's filtered, renormalized p_i at each verified position;
  // uniforms F32 [B, K+1] in [0, 1): uniforms[b][i] (i < K) decides draft i, uniforms[b][K] samples
  // the one extra token. For i = 0.. while accepted: draft i is accepted iff
  // uniforms[b][i] * q_i(d_i) < p_i(d_i) (fp32, no division: q(d) = 0 < p(d) accepts, p(d) = 0
  // rejects). At the first rejection i, the extra token is drawn with uniforms[b][K] from
  // normalize(max(p_i - q_i, 0)) (fp32 residual) by the inverse CDF of sample_from_probs (if that
  // residual is all zero, i.e. p_i <= q_i everywhere, e.g. p_i == q_i and q_i(d_i) = 0: from p_i);
  // if all n = num_drafts[b] drafts are accepted, from p_n (the bonus token). Rows of p and q need
  // not sum to 1. Drafts and uniforms in slots n..K-1 are not read.
  // out_ids I32 [B, K+1]: the accepted drafts, then the extra token, then -1 to the end;
  // out_num_emitted I32 [B] = accepted + 1. Outputs must not alias inputs. K = 0 is allowed (a plain
  // sample from p_0). Values in device memory (num_drafts, draft ids, uniforms) are checked by the CPU
  // backend only.
  virtual void speculative_verify(const TensorView& draft_probs, const TensorView& draft_ids,
                                  const TensorView& num_drafts, const TensorView& target_probs,
                                  const TensorView& uniforms, const TensorView& out_ids,
                                  const TensorView& out_num_emitted) = 0;
};

// linear_group's own preconditions, shared by every backend (each also checks every (x, w[i],
// out[i]) as linear does): as many outputs as weights, at most Backend::kMaxLinearGroup, no output
// aliasing another.
void check_linear_group(std::span<const Weight* const> w, std::span<const TensorView> out);

}  // namespace mla::ops
