/*
 * world/component.c -- component registration and schema validation.
 *
 * Validation happens completely before anything is stored, so a rejected
 * descriptor leaves the registry exactly as it was.
 */
#include <stdlib.h>
#include <string.h>

#include "keel_wal/wal.h"
#include "world/world_internal.h"

static bool type_valid(keel_type t)
{
    return t > KEEL_TYPE_INVALID && t < KEEL_TYPE_COUNT_;
}

uint32_t keel_type_size(keel_type t)
{
    return kw_scalar_width(t); /* the type table is the on-disk format's */
}

const char *keel_type_name(keel_type t)
{
    return kw_scalar_name(t);
}

const char *keel_discipline_name(keel_discipline d)
{
    return kw_discipline_name((uint32_t)d);
}

static uint32_t field_count(const keel_field *f)
{
    return f->count ? f->count : 1;
}

/* Byte length of a field, or UINT64_MAX-safe 64-bit product. */
static uint64_t field_bytes(const keel_field *f)
{
    return (uint64_t)keel_type_size(f->type) * field_count(f);
}

static int check_field(const keel_component_desc *d, uint32_t i)
{
    const keel_field *f = &d->fields[i];
    int rc = core_name_check(f->name, KEEL_NAME_MAX, "component '%s': field %u's name", d->name, i);
    if (rc)
        return rc;
    if (!type_valid(f->type))
        return core_fail(KEEL_EINVAL, "component '%s': field '%s' has type %d, not a keel_type (KEEL_U8 ... KEEL_BYTES)",
                         d->name, f->name, (int)f->type);
    if ((uint64_t)f->offset + field_bytes(f) > d->size)
        return core_fail(KEEL_EINVAL, "component '%s': field '%s' (%u x %s at offset %u, %llu bytes) ends past the value "
                         "size %u; make size cover every field",
                         d->name, f->name, field_count(f), keel_type_name(f->type), f->offset,
                         (unsigned long long)field_bytes(f), d->size);
    for (uint32_t j = 0; j < i; j++) {
        const keel_field *g = &d->fields[j];
        if (strcmp(f->name, g->name) == 0)
            return core_fail(KEEL_EINVAL, "component '%s': field name '%s' appears twice", d->name, f->name);
        bool disjoint = (uint64_t)f->offset + field_bytes(f) <= g->offset ||
                        (uint64_t)g->offset + field_bytes(g) <= f->offset;
        if (!disjoint)
            return core_fail(KEEL_EINVAL, "component '%s': fields '%s' (%s at offset %u) and '%s' (%s at offset %u) overlap",
                             d->name, g->name, keel_type_name(g->type), g->offset, f->name, keel_type_name(f->type),
                             f->offset);
    }
    return KEEL_OK;
}

static uint32_t field_align(const keel_field *f)
{
    return f->type == KEEL_BYTES ? 1 : keel_type_size(f->type);
}

/* The first field with the largest alignment (d has fields): it sets the
 * component's alignment when d->align is 0. */
static const keel_field *align_field(const keel_component_desc *d)
{
    const keel_field *widest = &d->fields[0];
    for (uint32_t i = 1; i < d->field_count; i++)
        if (field_align(&d->fields[i]) > field_align(widest))
            widest = &d->fields[i];
    return widest;
}

/* The alignment a descriptor asks for, or 0 when it is invalid. */
static uint32_t effective_align(const keel_component_desc *d)
{
    if (d->align)
        return (d->align & (d->align - 1)) == 0 && d->align <= 64 ? d->align : 0;
    return d->field_count ? field_align(align_field(d)) : 1;
}

static int check_desc(const keel_world *w, const keel_component_desc *d)
{
    if (!d)
        return core_fail(KEEL_EINVAL, "keel_component_register: descriptor is NULL");
    int rc = core_name_check(d->name, KEEL_NAME_MAX, "keel_component_register: the component name");
    if (rc)
        return rc;
    if (w->frozen)
        return core_fail(KEEL_EBUSY, "component '%s': registration is closed (the world is frozen)", d->name);
    keel_component existing = 0;
    if (keel_component_lookup(w, d->name, &existing) == KEEL_OK)
        return core_fail(KEEL_EEXIST, "component '%s' is already registered (id %u)", d->name, existing);
    if (w->ncomps >= KEEL_MAX_COMPONENTS)
        return core_fail(KEEL_ERANGE, "component '%s': the world already has the maximum of %d component types",
                         d->name, KEEL_MAX_COMPONENTS);
    if ((unsigned)d->discipline > KEEL_TRANSIENT)
        return core_fail(KEEL_EINVAL, "component '%s': discipline %d is not a keel_discipline (KEEL_VERSIONED, "
                         "KEEL_SINGLE_VERSION or KEEL_TRANSIENT)", d->name, (int)d->discipline);
    if (d->field_count > KEEL_MAX_FIELDS)
        return core_fail(KEEL_EINVAL, "component '%s': %u fields, the limit is %d", d->name, d->field_count,
                         KEEL_MAX_FIELDS);
    if (d->field_count && !d->fields)
        return core_fail(KEEL_EINVAL, "component '%s': field_count is %u but fields is NULL", d->name, d->field_count);
    if (d->size == 0 && d->field_count)
        return core_fail(KEEL_EINVAL, "component '%s': a tag (size 0) cannot have fields (%u declared); set size to "
                         "the value's bytes, or drop the fields", d->name, d->field_count);
    if (d->size && !d->field_count)
        return core_fail(KEEL_EINVAL,
                         "component '%s': a component with data needs a field schema (declare KEEL_BYTES for opaque data)",
                         d->name);
    for (uint32_t i = 0; i < d->field_count && !rc; i++)
        rc = check_field(d, i);
    if (rc)
        return rc;
    uint32_t align = effective_align(d);
    if (!align)
        return core_fail(KEEL_EINVAL, "component '%s': alignment %u is not a power of two <= 64", d->name, d->align);
    if (d->size % align && d->align)
        return core_fail(KEEL_EINVAL, "component '%s': size %u is not a multiple of its alignment %u", d->name, d->size,
                         align);
    if (d->size % align) {
        const keel_field *widest = align_field(d);
        return core_fail(KEEL_EINVAL, "component '%s': size %u is not a multiple of its alignment %u (that of field "
                         "'%s', %s); pad the size to a multiple of %u", d->name, d->size, align, widest->name,
                         keel_type_name(widest->type), align);
    }
    return KEEL_OK;
}

int keel_component_register(keel_world *w, const keel_component_desc *desc, keel_component *out)
{
    if (!w || !out)
        return core_fail(KEEL_EINVAL, "keel_component_register: world or out is NULL");
    int rc = check_desc(w, desc);
    if (rc)
        return rc;

    keel_field *fields = NULL;
    char(*names)[KEEL_NAME_MAX + 1] = NULL;
    if (desc->field_count) {
        fields = malloc(desc->field_count * sizeof *fields);
        names = malloc(desc->field_count * sizeof *names);
        if (!fields || !names) {
            free(fields);
            free(names);
            return core_fail(KEEL_ENOMEM, "component '%s': out of memory copying the schema", desc->name);
        }
    }
    keel_component id = ++w->ncomps;
    world_component *c = &w->comps[id];
    strcpy(c->name, desc->name);
    for (uint32_t i = 0; i < desc->field_count; i++) {
        strcpy(names[i], desc->fields[i].name);
        fields[i] = desc->fields[i];
        fields[i].name = names[i];
        fields[i].count = field_count(&desc->fields[i]);
    }
    c->fields = fields;
    c->field_names = names;
    c->desc = *desc;
    c->desc.name = c->name;
    c->desc.fields = fields;
    c->desc.align = effective_align(desc);
    *out = id;
    return KEEL_OK;
}

int keel_component_lookup(const keel_world *w, const char *name, keel_component *out)
{
    if (!w || !name || !out)
        return core_fail(KEEL_EINVAL, "keel_component_lookup: world, name or out is NULL");
    for (keel_component id = 1; id <= w->ncomps; id++) {
        if (strcmp(w->comps[id].name, name) == 0) {
            *out = id;
            return KEEL_OK;
        }
    }
    return core_fail(KEEL_ENOENT, "no component named '%s'", name);
}

const keel_component_desc *keel_component_info(const keel_world *w, keel_component c)
{
    return w && world_component_valid(w, c) ? &w->comps[c].desc : NULL;
}

uint32_t keel_component_count(const keel_world *w)
{
    return w ? w->ncomps : 0;
}

void keel_world_freeze(keel_world *w)
{
    if (w)
        w->frozen = true;
}

void component_fini(keel_world *w)
{
    for (keel_component id = 1; id <= w->ncomps; id++) {
        free(w->comps[id].fields);
        free(w->comps[id].field_names);
    }
}
