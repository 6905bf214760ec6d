// zt ckpt: checkpoints offline (issue 5). `info` lists a checkpoint directory; `consolidate`
// writes one safetensors file of the whole model from a sharded checkpoint (DeepSpeed's
// zero_to_fp32), with config.json beside it. No training starts.
#include <filesystem>
#include <iostream>
#include <vector>

#include "ckpt/checkpoint.h"
#include "commands.h"
#include "output_paths.h"
#include "zt/common/units.h"

namespace zt::cli {

void add_ckpt_command(CLI::App& app, Action& action) {
  auto* ck = app.add_subcommand("ckpt", "Inspect and consolidate checkpoints (written by zt train --checkpoint-dir)\n"
                                        "Example: zt ckpt info ck/");
  ck->require_subcommand(1);
  {
    auto* info = ck->add_subcommand("info", "List the checkpoints of a directory: complete or why not, what latest points to\n"
                                            "Example: zt ckpt info ck/");
    auto dir = std::make_shared<std::string>();
    info->add_option("CKPT_DIR", *dir, "checkpoint directory (the --checkpoint-dir of zt train)")->required();
    info->callback([&action, dir] {
      action = [dir] {
        std::string text;
        if (Status s = trainer::ckpt::describe_checkpoints(*dir, &text); !s) return fail(s.message());
        std::cout << text;
        return kExitOk;
      };
    });
  }
  {
    auto* co = ck->add_subcommand(
        "consolidate",
        "Write the whole model as one safetensors file (Hugging Face GPT-2 names and shapes) and config.json beside it, "
        "from a checkpoint's fp32 master weights (or a weights-only checkpoint's model.safetensors)\n"
        "Example: zt ckpt consolidate ck/ --out model/model.safetensors --dtype bf16");
    auto dir = std::make_shared<std::string>();
    auto tag = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto dtype = std::make_shared<std::string>("fp32");
    co->add_option("CKPT_DIR", *dir, "checkpoint directory")->required();
    co->add_option("--tag", *tag, "checkpoint to read, e.g. step000004 (default: latest, or the newest complete)");
    co->add_option("--out", *out, "safetensors file to write (config.json goes beside it; its folder is made if needed)")->required();
    co->add_option("--dtype", *dtype, "fp32, bf16 or fp16 (default fp32)")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    co->callback([&action, dir, tag, out, dtype] {
      action = [=] {
        const auto dt = trainer::parse_dtype(*dtype);
        // The shards are read while the output is written: an output inside the checkpoint
        // directory could replace a shard (or latest) before it is read.
        if (out->empty()) return fail("--out: the file name is empty; name the safetensors file to write");
        if (inside_directory(*out, *dir))
          return fail(*out + ": the output lies inside the checkpoint directory " + *dir +
                      " being read (choose a place outside it)");
        // The output's folder is made as Hugging Face's save_pretrained makes it (and removed again,
        // if it was made here and the consolidation fails).
        namespace fs = std::filesystem;
        const fs::path parent = fs::path(*out).parent_path();
        std::error_code ec;
        std::vector<fs::path> made;  // the folders made here, deepest first
        for (fs::path p = parent; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) made.push_back(p);
        if (!made.empty() && !fs::create_directories(parent, ec))
          return fail(*out + ": cannot create its directory " + parent.string() + ": " + ec.message());
        auto undo = [&] {
          for (const fs::path& p : made) fs::remove(p, ec);  // each only while empty
        };
        if (Status s = check_output_path(*out, {}); !s) return undo(), fail(s.message());
        trainer::ckpt::ConsolidateReport rep;
        if (Status s = trainer::ckpt::consolidate(*dir, *tag, *out, *dt, &rep); !s) return undo(), fail(s.message());
        if (!rep.notes.empty()) std::cerr << "zt ckpt: warning: " << rep.notes;
        std::cout << "consolidated " << rep.checkpoint << " (" << rep.source << "): " << rep.tensors << " tensors, "
                  << format_count(double(rep.params)) << " parameters, " << *dtype << ", " << format_bytes(double(rep.bytes))
                  << " -> " << *out << "\n"
                  << "config: " << rep.config_path << " (transformers: GPT2LMHeadModel.from_pretrained of that folder)\n";
        return kExitOk;
      };
    });
  }
}

}  // namespace zt::cli
