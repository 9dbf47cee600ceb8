/*
 * Format detection from content alone.
 *
 * Files arrive from watched directories and the network, where names and
 * extensions lie, so the decision rests on magic numbers: an ELF header whose
 * machine is EM_CUDA is a cubin, the fatbin magic is a fatbin, and text is PTX
 * when its first directive is .version or .target (PTX cannot start otherwise,
 * and CUDA C cannot start with a directive). Detection also refuses what is
 * plainly truncated, so that later stages see a consistent header; the full
 * structural checks are the metadata parsers' job (ptx/meta.c).
 */
#include <elf.h>
#include <stdio.h>
#include <string.h>

#include "ptx/ptx.h"

size_t hkp_skip_blank(const char *s, size_t n, size_t i, int *newline, int *unterminated) {
    while (i < n) {
        char c = s[i];
        if (c == '\n') {
            if (newline)
                *newline = 1;
            i++;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '\0') {
            i++;
        } else if (c == '/' && i + 1 < n && s[i + 1] == '/') {
            while (i < n && s[i] != '\n')
                i++;
        } else if (c == '/' && i + 1 < n && s[i + 1] == '*') {
            i += 2;
            while (i + 1 < n && !(s[i] == '*' && s[i + 1] == '/')) {
                if (s[i] == '\n' && newline)
                    *newline = 1;
                i++;
            }
            if (i + 1 >= n) {
                if (unterminated)
                    *unterminated = 1;
                return n;
            }
            i += 2;
        } else {
            break;
        }
    }
    return i;
}

/* Text here means: no NUL before the end (one trailing NUL, as a C string
 * passed with its terminator, is allowed) and almost no control bytes. */
static int looks_like_text(const unsigned char *p, size_t n) {
    size_t ctrl = 0;
    while (n > 0 && p[n - 1] == 0)
        n--;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c == 0)
            return 0;
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v' && c != 0x1b)
            ctrl++;
    }
    /* A stray control byte in a comment is tolerated; binary data is not. */
    return ctrl * 100 <= n;
}

int hkp_detect(const void *data, size_t size, hk_format *fmt, char *why, size_t why_size) {
    const unsigned char *p = data;

    if (why && why_size)
        why[0] = '\0';
    if (!fmt || (!data && size))
        return HK_ERR_INVALID;
    if (size == 0) {
        hkp_why(why, why_size, "empty input");
        return HK_ERR_FORMAT;
    }
    if (size >= SELFMAG && memcmp(p, ELFMAG, SELFMAG) == 0) {
        int rc = hkp_elf_check_header(p, size, why, why_size);
        if (rc)
            return rc;
        *fmt = HK_FORMAT_CUBIN;
        return 0;
    }
    if (size >= 4 && hkp_rd32(p) == HKP_FATBIN_MAGIC) {
        if (size < HKP_FATBIN_HEADER) {
            hkp_why(why, why_size, "truncated fatbin header (%zu bytes)", size);
            return HK_ERR_FORMAT;
        }
        uint32_t hsize = hkp_rd16(p + HKP_FATBIN_HSIZE_OFF);
        uint64_t fat = hkp_rd64(p + HKP_FATBIN_FAT_OFF);
        if (hsize < HKP_FATBIN_HEADER || hsize > size || fat > size - hsize) {
            hkp_why(why, why_size, "truncated fatbin (header says %llu bytes, have %zu)",
                    (unsigned long long)fat + hsize, size);
            return HK_ERR_FORMAT;
        }
        *fmt = HK_FORMAT_FATBIN;
        return 0;
    }
    if (!looks_like_text(p, size)) {
        hkp_why(why, why_size, "binary data that is neither a cubin (ELF) nor a fatbin");
        return HK_ERR_FORMAT;
    }
    const char *s = data;
    /* NUL counts as blank: looks_like_text allowed trailing ones only. */
    size_t i = hkp_skip_blank(s, size, 0, NULL, NULL);
    if (i >= size) {
        hkp_why(why, why_size, "empty input (only whitespace and comments)");
        return HK_ERR_FORMAT;
    }
    if (s[i] == '.') {
        static const char *const dirs[] = {".version", ".target"};
        for (size_t k = 0; k < sizeof dirs / sizeof dirs[0]; k++) {
            size_t l = strlen(dirs[k]);
            if (size - i > l && memcmp(s + i, dirs[k], l) == 0 &&
                !hkp_is_ident_char((unsigned char)s[i + l])) {
                *fmt = HK_FORMAT_PTX;
                return 0;
            }
        }
        hkp_why(why, why_size, "text starting with a directive other than .version/.target");
        return HK_ERR_FORMAT;
    }
    *fmt = HK_FORMAT_CUDA_C;
    return 0;
}
