#include "train/zero_optimizer.h"

#include "train/optimizer.h"
#include "util/error.h"

namespace gnmr {

ZeroAdamW::ZeroAdamW(Backend& backend, Communicator& comm, const LlamaModel& model,
                     const TrainConfig& train)
    : backend_(backend),
      comm_(comm),
      params_(model.params()),
      train_(train),
      rank_(comm.rank()),
      flat_weights_(model.flat_weights()),
      flat_grads_(model.flat_grads()) {
  layout_ = make_zero_shard_layout(params_, flat_elements_of(params_), comm.world_size());
  GNMR_CHECK(flat_weights_.numel() == layout_.padded_elements() &&
                 flat_grads_.numel() == layout_.padded_elements(),
             "ZeRO-1: the model's flat buffers hold " + std::to_string(flat_weights_.numel()) +
                 " elements, the shard layout needs " + std::to_string(layout_.padded_elements()) +
                 " (construct the model with flat_elements_multiple = world × kZeroShardAlign)");
  const int64_t shard = layout_.shard_elements;
  own_grads_ = tensor_view(flat_grads_, {shard}, layout_.shard_begin(rank_));
  first_moment_ =
      backend_.allocate("adamw.m.shard", {shard}, DType::F32, MemoryRole::OptimizerState);
  second_moment_ =
      backend_.allocate("adamw.v.shard", {shard}, DType::F32, MemoryRole::OptimizerState);
  backend_.fill_zero(first_moment_);
  backend_.fill_zero(second_moment_);
  for (const ParamInfo& p : params_) grad_in_shard_.push_back(tensor_view(p.grad, {0}, 0));
  for (const ShardPiece& piece : layout_.pieces[size_t(rank_)]) {
    const ParamInfo& p = params_[size_t(piece.param_index)];
    PieceViews v;
    v.weight = tensor_view(p.weight, {piece.count}, piece.param_begin);
    v.grad = tensor_view(p.grad, {piece.count}, piece.param_begin);
    v.first_moment = tensor_view(first_moment_, {piece.count}, piece.shard_offset);
    v.second_moment = tensor_view(second_moment_, {piece.count}, piece.shard_offset);
    v.weight_decay = p.weight_decay;
    grad_in_shard_[size_t(piece.param_index)] = v.grad;
    pieces_.push_back(v);
  }
  backend_.plan_sum_squares(grad_in_shard_);
}

void ZeroAdamW::reduce_gradients() {
  comm_.reduce_scatter_sum(flat_grads_);
}

void ZeroAdamW::average_gradients() {
  // The same factor and op as the plain path (session.cpp), so two ranks give its bits.
  if (comm_.world_size() > 1) backend_.scale(own_grads_, 1.0f / float(comm_.world_size()));
}

void ZeroAdamW::sum_squares(Tensor& out_per_param) {
  backend_.sum_squares(grad_in_shard_, out_per_param);
  comm_.allreduce_sum(out_per_param);
}

void ZeroAdamW::step(double lr, const Tensor& clip, int64_t step) {
  std::vector<AdamWUpdate> updates;
  updates.reserve(pieces_.size());
  for (PieceViews& v : pieces_) {
    updates.push_back(AdamWUpdate{v.weight, v.grad, v.first_moment, v.second_moment,
                                  adamw_step(train_, lr, step, v.weight_decay)});
  }
  backend_.adamw_update_batch(updates, clip);
}

void ZeroAdamW::gather_weights() {
  comm_.all_gather(flat_weights_);
}

}  // namespace gnmr
