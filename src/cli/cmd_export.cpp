// `gnmr export --checkpoint CKPT_DIR --out HF_DIR [--dtype float32|bfloat16]`
#include "cli/commands.h"
#include "cli/path_flags.h"
#include "train/hf_format.h"

namespace gnmr {

CommandAction add_export_command(CLI::App& app) {
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("float32");
  app.add_option("--checkpoint", *checkpoint, "gnmr checkpoint directory (RUN/checkpoints/step_N)")
      ->required();
  app.add_option("--out", *out, "Hugging Face model folder to create (must not exist)")->required();
  app.add_option("--dtype", *dtype, "Weight dtype in model.safetensors")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  return [checkpoint, out, dtype] {
    require_directory("--checkpoint", *checkpoint, ErrorKind::Checkpoint);
    export_hf_model(*checkpoint, *out, *dtype);
  };
}

}  // namespace gnmr
