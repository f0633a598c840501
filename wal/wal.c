#include "keel_wal/wal.h"

uint32_t keel_wal_format_version(void)
{
    return KEEL_WAL_FORMAT_VERSION;
}
