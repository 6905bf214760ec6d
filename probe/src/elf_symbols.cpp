#include "elf_symbols.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace zt::probe {
namespace {

// Reads exactly n bytes at `off`; false on a short file.
bool read_at(int fd, void* dst, size_t n, uint64_t off) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r <= 0) return false;
    p += r, n -= size_t(r), off += uint64_t(r);
  }
  return true;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool ElfSymbols::load(const std::string& path) {
  syms_.clear();
  strtab_.clear();
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return false;
  Elf64_Ehdr eh{};
  if (!read_at(f.fd, &eh, sizeof eh, 0) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 ||
      eh.e_shnum > 65000)
    return false;
  position_independent_ = eh.e_type == ET_DYN;
  first_load_ = 0;
  if (eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum > 0 && eh.e_phnum < 4096) {
    std::vector<Elf64_Phdr> ph(eh.e_phnum);
    if (read_at(f.fd, ph.data(), ph.size() * sizeof(Elf64_Phdr), eh.e_phoff)) {
      bool any = false;
      for (const auto& p : ph)
        if (p.p_type == PT_LOAD && (!any || p.p_vaddr < first_load_)) first_load_ = p.p_vaddr, any = true;
      const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096);
      first_load_ &= ~(page - 1);
    }
  }
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  if (!read_at(f.fd, sh.data(), sh.size() * sizeof(Elf64_Shdr), eh.e_shoff)) return false;
  const Elf64_Shdr* table = nullptr;
  for (const auto& s : sh)
    if (s.sh_type == SHT_SYMTAB) table = &s;
  if (!table)
    for (const auto& s : sh)
      if (s.sh_type == SHT_DYNSYM) table = &s;
  if (!table || table->sh_entsize != sizeof(Elf64_Sym) || table->sh_link >= sh.size()) return false;
  const Elf64_Shdr& strs = sh[table->sh_link];
  const uint64_t limit = uint64_t(1) << 30;  // a symbol table past 1 GiB is not a file we should read
  if (table->sh_size > limit || strs.sh_size > limit) return false;
  std::vector<Elf64_Sym> raw(table->sh_size / sizeof(Elf64_Sym));
  strtab_.resize(strs.sh_size);
  if (!read_at(f.fd, raw.data(), raw.size() * sizeof(Elf64_Sym), table->sh_offset) ||
      !read_at(f.fd, strtab_.data(), strtab_.size(), strs.sh_offset)) {
    strtab_.clear();
    return false;
  }
  for (const auto& s : raw) {
    const int type = ELF64_ST_TYPE(s.st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s.st_shndx == SHN_UNDEF || s.st_value == 0 || s.st_size == 0 ||
        s.st_name >= strtab_.size())
      continue;
    syms_.push_back({s.st_value, s.st_size, s.st_name});
  }
  std::sort(syms_.begin(), syms_.end(), [](const Sym& a, const Sym& b) { return a.start < b.start; });
  return !syms_.empty();
}

const char* ElfSymbols::find(uint64_t addr) const {
  auto it = std::upper_bound(syms_.begin(), syms_.end(), addr, [](uint64_t a, const Sym& s) { return a < s.start; });
  // Functions may nest (aliases, a cold part inside a larger range): the nearest start below that
  // still covers the address; a few steps back at most.
  for (int back = 0; it != syms_.begin() && back < 8; ++back) {
    --it;
    if (addr < it->start + it->size) return strtab_.c_str() + it->name;
  }
  return nullptr;
}

}  // namespace zt::probe
