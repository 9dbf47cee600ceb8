/*
 * The names and messages of hotkern's error codes, from the one table in
 * hotkern.h (HK_ERROR_TABLE), so that the enum, hk_strerror and hk_err_name
 * cannot drift apart. At the bottom (base/, see base/driver.h): the builds
 * in ptx/ and the release code in net/ name errors too, and net/ is also
 * built (for fuzzing) without the rest of the engine.
 */
#include "hotkern/hotkern.h"

const char *hk_strerror(int err) {
    switch (err) {
#define HK_ERROR_MESSAGE_(name, value, message)                                                    \
    case name:                                                                                     \
        return message;
        HK_ERROR_TABLE(HK_ERROR_MESSAGE_)
#undef HK_ERROR_MESSAGE_
    default:
        return "unknown error";
    }
}

const char *hk_err_name(int err) {
    switch (err) {
#define HK_ERROR_NAME_(name, value, message)                                                       \
    case name:                                                                                     \
        return #name;
        HK_ERROR_TABLE(HK_ERROR_NAME_)
#undef HK_ERROR_NAME_
    default:
        return "HK_ERR_UNKNOWN";
    }
}
