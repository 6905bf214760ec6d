// cli/help_format.h: `--help` wrapped to the terminal. CLI11 2.1 prints each description on one
// line however long it is; HelpFormatter wraps descriptions under their column, and the command's
// own text, to a width (text_width.h's output_width(): the terminal's, at most 100 columns). A command's list of
// subcommands shows each one's summary (the first line of its description); `zt SUB --help`
// shows the rest. A description's line breaks end paragraphs: do not break a sentence. Set it on the top app before adding subcommands: CLI11 copies it into each one.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <string>

namespace zt::cli {

class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(size_t width);
  std::string make_description(const CLI::App* app) const override;
  std::string make_option(const CLI::Option* opt, bool is_positional) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
  std::string make_footer(const CLI::App* app) const override;
  std::string make_usage(const CLI::App* app, std::string name) const override;

 private:
  // "  NAME" padded to the description column, then `text` wrapped beside it (under it when the
  // name is as wide as the column).
  std::string entry(const std::string& name, const std::string& text) const;
  size_t width_;
};

}  // namespace zt::cli
