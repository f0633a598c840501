/*
 * keel/keel.h -- everything public. keel is a transactional ECS runtime with
 * write-ahead-log durability; see docs/architecture.md for the map.
 */
#ifndef KEEL_KEEL_H
#define KEEL_KEEL_H

#include "keel/error.h"
#include "keel/entity.h"
#include "keel/component.h"
#include "keel/world.h"
#include "keel/query.h"
#include "keel/command.h"
#include "keel/schedule.h"
#include "keel/runtime.h"
#include "keel/txn.h"
#include "keel/durability.h"
#include "keel/replication.h"
#include "keel/view.h"
#include "keel/telemetry.h"
#include "keel/metrics.h"
#include "keel/failpoint.h"
#include "keel/version.h"

#endif
