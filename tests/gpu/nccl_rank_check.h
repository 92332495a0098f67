// One rank of the multi-process checks of the nccl communicator (docs/DESIGN.md §7).
// test_gpu_nccl.cpp starts W processes of test_gpu, each running this as torchrun starts ranks
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; the TCP rendezvous hands out the NCCL id),
// one GPU each: on a machine with W GPUs, or on the emulation (GNMR_CUDA_EMULATED), where each
// process emulates its GPU and the emulated NCCL joins them. Modes:
//   collectives  every collective training uses, on inputs whose sums are exact in any order of
//                addition, checked by each rank on its own
//   exit         rank W-1 dies (_Exit) after one collective
//   abort        rank W-1 aborts the communicator after one collective
//   absent       rank W-1 takes the NCCL id and never joins
// Returns (or, for rank W-1 in exit and abort, exits with) 0 every check passed; 1 a check
// failed (printed); 2 an unknown mode; 3 an Error, printed: how the other ranks must end in the
// exit, abort and absent modes, within their deadline, naming their rank and the collective;
// 4 the aborting rank; 9 the dying one.
#pragma once

#include <string>

namespace gnmr {

int nccl_rank_check(const std::string& mode);

}  // namespace gnmr
