/* Unicode letters and numbers (general categories L and N) by code point, for the byte-level
 * BPE pre-tokenizer. Private to the library. */
#ifndef GP_IO_UNICODE_CLASSES_H
#define GP_IO_UNICODE_CLASSES_H

#include <stdbool.h>
#include <stdint.h>

bool gp_unicode_is_letter(uint32_t cp);
bool gp_unicode_is_number(uint32_t cp);

#endif
