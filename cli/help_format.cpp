// cli/help_format.cpp: see help_format.h.
#include "help_format.h"

#include <algorithm>

#include "text_width.h"

namespace zt::cli {

HelpFormatter::HelpFormatter(size_t width) : width_(width) {
  // The name column: CLI11's 30 on a wide screen, less on a narrow one (the descriptions keep
  // two thirds of the width).
  column_width(std::min<size_t>(30, width / 3));
}

std::string HelpFormatter::entry(const std::string& name, const std::string& text) const {
  const size_t col = get_column_width();
  std::string out = "  " + name;
  if (text.empty()) return out + "\n";
  if (display_width(out) + 2 > col) {  // two spaces at least before the text
    out += "\n" + std::string(col, ' ');
  } else {
    out = pad_right(out, col);
  }
  return out + wrap_text(text, width_, col) + "\n";
}

std::string HelpFormatter::make_description(const CLI::App* app) const {
  const std::string d = CLI::Formatter::make_description(app);  // the description and CLI11's notes, '\n' last
  std::string out;
  for (size_t begin = 0, nl; begin < d.size(); begin = nl + 1) {
    nl = d.find('\n', begin);
    const std::string para = d.substr(begin, nl - begin);
    // An example's command, when it is too long, goes on under itself, not under "Example:".
    const std::string label = "Example: ";
    out += para.compare(0, label.size(), label) == 0 ? label + wrap_text(para.substr(label.size()), width_, label.size())
                                                     : wrap_text(para, width_, 0);
    out += '\n';
  }
  return out;
}

std::string HelpFormatter::make_option(const CLI::Option* opt, bool is_positional) const {
  return entry(make_option_name(opt, is_positional) + make_option_opts(opt), make_option_desc(opt));
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  const std::string& d = sub->get_description();
  return entry(sub->get_display_name(true), d.substr(0, d.find('\n')));
}

std::string HelpFormatter::make_usage(const CLI::App* app, std::string name) const {
  const std::string u = CLI::Formatter::make_usage(app, name);  // one line, '\n' last
  return wrap_text(u.substr(0, u.size() - 1), width_, 2) + "\n";
}

std::string HelpFormatter::make_footer(const CLI::App* app) const {
  const std::string f = app->get_footer();
  return f.empty() ? f : wrap_text(f, width_, 0) + "\n";
}

}  // namespace zt::cli
