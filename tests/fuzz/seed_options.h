// The controller options the controller_state seed corpus is written with (write_seeds.cpp)
// and read back under (fuzz_controller_state.cpp).
#pragma once

#include "controller/controller_options.h"

inline gnmr::ControllerOptions seed_options() {
  gnmr::ControllerOptions o;
  o.max_active = 2;
  o.window = 2;
  o.lock_steps = 3;
  o.warmup_steps = 0;
  return o;
}
