//! [`VulkanProgram`]: a compute shader, as SPIR-V (what a compiler emits)
//! or WGSL compiled at run time by naga; its buffer bindings and
//! push-constant scalars read from the module, and its pipeline made once
//! per device.

use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;

use super::Vulkan;
use super::context::Context;
use crate::error::{Error, Result};
use crate::program::{KernelSignature, Program, Scalar};

/// The type of one push-constant scalar a shader takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ScalarType {
    U32,
    I32,
    F32,
    U64,
    I64,
    F64,
}

impl ScalarType {
    fn name(self) -> &'static str {
        match self {
            ScalarType::U32 => "u32",
            ScalarType::I32 => "i32",
            ScalarType::F32 => "f32",
            ScalarType::U64 => "u64",
            ScalarType::I64 => "i64",
            ScalarType::F64 => "f64",
        }
    }

    /// How many bytes it takes in the push constants.
    fn width(self) -> u32 {
        match self {
            ScalarType::U32 | ScalarType::I32 | ScalarType::F32 => 4,
            ScalarType::U64 | ScalarType::I64 | ScalarType::F64 => 8,
        }
    }

    /// The bytes `scalar` puts in the push constants, if it is of this type.
    fn bytes(self, scalar: &Scalar) -> Option<Vec<u8>> {
        Some(match (self, scalar) {
            (ScalarType::U32, Scalar::U32(v)) => v.to_ne_bytes().to_vec(),
            (ScalarType::I32, Scalar::I32(v)) => v.to_ne_bytes().to_vec(),
            (ScalarType::F32, Scalar::F32(v)) => v.to_ne_bytes().to_vec(),
            (ScalarType::U64, Scalar::U64(v)) => v.to_ne_bytes().to_vec(),
            (ScalarType::I64, Scalar::I64(v)) => v.to_ne_bytes().to_vec(),
            (ScalarType::F64, Scalar::F64(v)) => v.to_ne_bytes().to_vec(),
            _ => return None,
        })
    }
}

/// A compute shader for the Vulkan backend. Clones name the same shader.
#[derive(Clone)]
pub struct VulkanProgram {
    inner: Arc<ProgramInner>,
}

/// A WGSL module whose `@workgroup_size` names `override`s (one per axis;
/// `None`: fixed there), compiled per local size an exec asks for.
type Overridable = (naga::Module, naga::valid::ModuleInfo, [Option<String>; 3]);

struct ProgramInner {
    signature: KernelSignature,
    /// The SPIR-V handed to the driver, where the work-group size is fixed.
    spirv: Vec<u32>,
    overridable: Option<Overridable>,
    entry: std::ffi::CString,
    workgroup_size: [u32; 3],
    /// Each push-constant scalar: its type and byte offset.
    scalars: Vec<(ScalarType, u32)>,
    /// Per buffer argument, whether the shader may write it.
    writes: Vec<bool>,
    push_size: u32,
    /// The pipeline, per `VkDevice` (one per physical device, shared by
    /// its handles, kept for the process: the cache holds no handle) and
    /// local size it was used with.
    pipelines: Mutex<Vec<([u32; 3], Arc<Pipeline>)>>,
}

/// A program's pipeline on one `VkDevice`.
pub(super) struct Pipeline {
    /// The device's function table; the `VkDevice` outlives every
    /// pipeline (it is kept for the process).
    device: ash::Device,
    pub(super) set_layout: vk::DescriptorSetLayout,
    pub(super) layout: vk::PipelineLayout,
    pub(super) pipeline: vk::Pipeline,
}

impl VulkanProgram {
    /// What tells this program apart from every other alive (a
    /// recording holds the programs it names, so the address is not
    /// reused under it).
    pub(super) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// A kernel from WGSL `source`, compiled by naga to SPIR-V: entry point
    /// `entry` (a `@compute` function), named `name` in errors and
    /// profiles. Its buffers are the `var<storage>` globals of
    /// `@group(0)`, bindings `0..n` in argument order; its scalars the
    /// members of its `var<immediate>` struct (or the one scalar there),
    /// in order (`u32`, `i32`, `f32`). A `@workgroup_size` of constants
    /// fixes an exec's local size; one of `override`s
    /// (`override local_x: u32 = 64; @workgroup_size(local_x)`) takes each
    /// exec's local size, the shader compiled once per size used.
    ///
    /// # Errors
    /// [`Error::Compile`] with naga's message, line and column, when the
    /// source does not parse or validate; [`Error::InvalidProgram`] when
    /// its interface is not one hwqueue can call (see above).
    pub fn from_wgsl(name: impl Into<String>, source: &str, entry: &str) -> Result<Self> {
        let name = name.into();
        guarded(&name, "reading the WGSL", || {
            Self::read_wgsl(name.clone(), source, entry)
        })
    }

    fn read_wgsl(name: String, source: &str, entry: &str) -> Result<Self> {
        let module = naga::front::wgsl::parse_str(source).map_err(|error| {
            let at = error
                .location(source)
                .map(|l| format!(" at line {}, column {}", l.line_number, l.line_position))
                .unwrap_or_default();
            Error::Compile {
                program: name.clone(),
                compiler: "naga (WGSL)".into(),
                output: format!("{}{at}\n{}", error.message(), error.emit_to_string(source)),
            }
        })?;
        Self::from_module(name, &module, entry, Some(source))
    }

    /// A kernel from SPIR-V `words` (as a compiler emits it), entry point
    /// `entry`. The module is parsed (by naga) to read its interface, as
    /// [`from_wgsl`](Self::from_wgsl) says, and handed to the driver as
    /// given.
    ///
    /// # Errors
    /// [`Error::InvalidProgram`] when the words are not a SPIR-V module
    /// naga reads (naga's SPIR-V reader assumes a valid module and panics
    /// on some malformed ones: such a panic is caught and reported so), or
    /// its interface is not one hwqueue can call.
    pub fn from_spirv(name: impl Into<String>, words: &[u32], entry: &str) -> Result<Self> {
        let name = name.into();
        guarded(&name, "reading the SPIR-V", || {
            Self::read_spirv(name.clone(), words, entry)
        })
    }

    fn read_spirv(name: String, words: &[u32], entry: &str) -> Result<Self> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let module =
            naga::front::spv::parse_u8_slice(&bytes, &naga::front::spv::Options::default())
                .map_err(|error| Error::InvalidProgram {
                    program: name.clone(),
                    reason: format!("the SPIR-V does not parse: {error}"),
                })?;
        let reflected = reflect(&name, &module, entry)?;
        Ok(Self::with(name, words.to_vec(), None, entry, reflected))
    }

    fn from_module(
        name: String,
        module: &naga::Module,
        entry: &str,
        source: Option<&str>,
    ) -> Result<Self> {
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::IMMEDIATES,
        )
        .validate(module)
        .map_err(|error| Error::Compile {
            program: name.clone(),
            compiler: "naga (validation)".into(),
            output: match source {
                Some(source) => error.emit_to_string(source),
                None => error.to_string(),
            },
        })?;
        let reflected = reflect(&name, module, entry)?;
        let point = module
            .entry_points
            .iter()
            .find(|e| e.name == entry)
            .expect("reflect found it");
        if let Some(overrides) = &point.workgroup_size_overrides {
            let mut names: [Option<String>; 3] = [None, None, None];
            for (axis, expression) in overrides.iter().enumerate() {
                let Some(expression) = expression else {
                    continue;
                };
                match module.global_expressions[*expression] {
                    naga::Expression::Override(handle) => {
                        names[axis] = module.overrides[handle].name.clone();
                    }
                    _ => {
                        return Err(Error::InvalidProgram {
                            program: name,
                            reason: "its @workgroup_size is an expression of overrides; give \
                                     each axis a constant or one `override` of its own"
                                .into(),
                        });
                    }
                }
            }
            return Ok(Self::with(
                name,
                Vec::new(),
                Some((module.clone(), info, names)),
                entry,
                reflected,
            ));
        }
        let spirv = compile(&name, module, &info, entry)?;
        Ok(Self::with(name, spirv, None, entry, reflected))
    }

    fn with(
        name: String,
        spirv: Vec<u32>,
        overridable: Option<Overridable>,
        entry: &str,
        reflected: Reflected,
    ) -> Self {
        Self {
            inner: Arc::new(ProgramInner {
                signature: KernelSignature::new(name, reflected.buffers, reflected.scalars.len()),
                spirv,
                overridable,
                entry: std::ffi::CString::new(entry).unwrap_or_default(),
                workgroup_size: reflected.workgroup_size,
                push_size: reflected.push_size,
                scalars: reflected.scalars,
                writes: reflected.writes,
                pipelines: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The SPIR-V handed to the driver (empty for a shader compiled per
    /// local size).
    pub fn spirv(&self) -> &[u32] {
        &self.inner.spirv
    }

    /// The `@workgroup_size` an exec's local size must be; `None` where the
    /// shader takes each exec's (its size is `override`s).
    pub fn workgroup_size(&self) -> Option<[u32; 3]> {
        self.inner
            .overridable
            .is_none()
            .then_some(self.inner.workgroup_size)
    }

    /// Whether the shader may write buffer argument `index`: a
    /// `var<storage, read>` (SPIR-V `NonWritable`) is only read.
    pub(super) fn writes(&self, index: usize) -> bool {
        self.inner.writes.get(index).copied().unwrap_or(true)
    }

    /// How many bytes its push constants span (0: none).
    pub(super) fn push_size(&self) -> u32 {
        self.inner.push_size
    }

    /// The push-constant bytes of `scalars`.
    ///
    /// # Errors
    /// [`Error::InvalidArguments`] for a scalar of another type than the
    /// shader's.
    pub(super) fn push_constants(&self, scalars: &[Scalar]) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.inner.push_size as usize];
        for (index, (scalar, &(kind, offset))) in
            scalars.iter().zip(&self.inner.scalars).enumerate()
        {
            let value = kind.bytes(scalar).ok_or_else(|| Error::InvalidArguments {
                program: self.inner.signature.name.clone(),
                reason: format!(
                    "scalar {index} is a {} but the shader's push constant there is a {}; pass \
                     `Scalar::{}`",
                    scalar.type_name(),
                    kind.name(),
                    kind.name().to_uppercase()
                ),
            })?;
            // Within `push_size` by construction (`reflect`); said, not
            // skipped, should that ever not hold.
            let (at, size) = (offset as usize, bytes.len());
            let slot =
                bytes
                    .get_mut(at..at + value.len())
                    .ok_or_else(|| Error::InvalidProgram {
                        program: self.inner.signature.name.clone(),
                        reason: format!(
                            "scalar {index} lies at bytes {at}.. past the push constants' {size} \
                         (hwqueue's bug: `reflect` sizes them to cover every member)"
                        ),
                    })?;
            slot.copy_from_slice(&value);
        }
        Ok(bytes)
    }

    /// The pipeline on `context`'s device for an exec of local size
    /// `local`, made on first use.
    pub(super) fn pipeline(
        &self,
        context: &Arc<Context>,
        local: [u32; 3],
    ) -> Result<Arc<Pipeline>> {
        let local = if self.inner.overridable.is_some() {
            local
        } else {
            self.inner.workgroup_size
        };
        let device = context.device.handle();
        let cached = |pipelines: &[([u32; 3], Arc<Pipeline>)]| {
            pipelines
                .iter()
                .find(|(size, p)| *size == local && p.device.handle() == device)
                .map(|(_, found)| found.clone())
        };
        if let Some(found) = cached(&self.inner.pipelines.lock()) {
            return Ok(found);
        }
        // Compiled without the lock: another device, or another size,
        // does not wait for this one.
        let spirv = match &self.inner.overridable {
            None => None,
            Some((module, info, names)) => {
                let mut constants = naga::back::PipelineConstants::default();
                for (axis, name) in names.iter().enumerate() {
                    if let Some(name) = name {
                        constants.insert(name.clone(), f64::from(local[axis]));
                    }
                }
                let entry = self.inner.entry.to_string_lossy();
                let name = &self.inner.signature.name;
                Some(guarded(name, "compiling for a local size", || {
                    let (module, info) = naga::back::pipeline_constants::process_overrides(
                        module,
                        info,
                        Some((naga::ShaderStage::Compute, &entry)),
                        &constants,
                    )
                    .map_err(|error| Error::Compile {
                        program: name.clone(),
                        compiler: "naga (overrides)".into(),
                        output: error.to_string(),
                    })?;
                    compile(name, &module, &info, &entry)
                })?)
            }
        };
        let spirv = spirv.as_deref().unwrap_or(&self.inner.spirv);
        let made = Arc::new(self.make_pipeline(context, spirv)?);
        let mut pipelines = self.inner.pipelines.lock();
        // Made meanwhile by another thread: that one is kept, and this
        // one, used by nothing, destroyed.
        if let Some(found) = cached(&pipelines) {
            return Ok(found);
        }
        pipelines.push((local, made.clone()));
        Ok(made)
    }

    fn make_pipeline(&self, context: &Arc<Context>, spirv: &[u32]) -> Result<Pipeline> {
        let device = &context.device;
        let inner = &*self.inner;
        let bindings: Vec<vk::DescriptorSetLayoutBinding<'_>> = (0..inner.signature.buffers)
            .map(|binding| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(binding as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let ranges = [vk::PushConstantRange {
            stage_flags: vk::ShaderStageFlags::COMPUTE,
            offset: 0,
            size: inner.push_size,
        }];
        // Where the device can, a set's descriptors may be rewritten while
        // a recorded command buffer binds it (`replay.rs`'s rebinding);
        // its sets then come from pools made for that (`descriptor_set`).
        let after_bind = vec![vk::DescriptorBindingFlags::UPDATE_AFTER_BIND; bindings.len()];
        let mut binding_flags =
            vk::DescriptorSetLayoutBindingFlagsCreateInfo::default().binding_flags(&after_bind);
        let mut set_layout_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        if context.physical.update_after_bind {
            set_layout_info = set_layout_info
                .flags(vk::DescriptorSetLayoutCreateFlags::UPDATE_AFTER_BIND_POOL)
                .push_next(&mut binding_flags);
        }
        // SAFETY: every create-info and array lives across its call; what is
        // made is destroyed by `Pipeline`'s drop, or here on failure.
        unsafe {
            let set_layout = device
                .create_descriptor_set_layout(&set_layout_info, None)
                .map_err(|e| context.error("vkCreateDescriptorSetLayout", e))?;
            let set_layouts = [set_layout];
            let mut layout_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts);
            if inner.push_size > 0 {
                layout_info = layout_info.push_constant_ranges(&ranges);
            }
            let layout = match device.create_pipeline_layout(&layout_info, None) {
                Ok(layout) => layout,
                Err(e) => {
                    device.destroy_descriptor_set_layout(set_layout, None);
                    return Err(context.error("vkCreatePipelineLayout", e));
                }
            };
            let module = match device
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(spirv), None)
            {
                Ok(module) => module,
                Err(e) => {
                    device.destroy_pipeline_layout(layout, None);
                    device.destroy_descriptor_set_layout(set_layout, None);
                    return Err(context.error("vkCreateShaderModule", e));
                }
            };
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(&inner.entry);
            let create = [vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout)];
            let made = device.create_compute_pipelines(vk::PipelineCache::null(), &create, None);
            device.destroy_shader_module(module, None);
            match made {
                Ok(pipelines) => Ok(Pipeline {
                    device: device.clone(),
                    set_layout,
                    layout,
                    pipeline: pipelines[0],
                }),
                Err((_, e)) => {
                    device.destroy_pipeline_layout(layout, None);
                    device.destroy_descriptor_set_layout(set_layout, None);
                    Err(context.error(
                        &format!("vkCreateComputePipelines for `{}`", inner.signature.name),
                        e,
                    ))
                }
            }
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: the last handle is going: batches hold the pipeline until
        // they completed, so no pending work names these objects.
        unsafe {
            let device = &self.device;
            device.destroy_pipeline(self.pipeline, None);
            device.destroy_pipeline_layout(self.layout, None);
            device.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

impl VulkanProgram {
    /// How many pipelines the program holds: one per `VkDevice` and local
    /// size it ran with (for tests).
    #[doc(hidden)]
    pub fn cached_pipelines(&self) -> usize {
        self.inner.pipelines.lock().len()
    }
}

impl std::fmt::Debug for VulkanProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VulkanProgram({})", self.inner.signature.name)
    }
}

impl Program for VulkanProgram {
    type Backend = Vulkan;

    fn signature(&self) -> &KernelSignature {
        &self.inner.signature
    }

    #[inline]
    fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// A module's interface, as hwqueue calls it.
struct Reflected {
    buffers: usize,
    /// Per buffer, whether the shader may write it.
    writes: Vec<bool>,
    scalars: Vec<(ScalarType, u32)>,
    push_size: u32,
    workgroup_size: [u32; 3],
}

/// The most push-constant bytes a shader may span: Vulkan's required
/// `maxPushConstantsSize` is 128, and no device offers more than 4 KiB.
const MAX_PUSH_BYTES: u32 = 4096;

/// Runs `work`, a use of naga on `name`'s module, turning a panic (naga's
/// SPIR-V reader and its back ends assume a valid module: some malformed
/// ones panic it) into [`Error::InvalidProgram`] saying what panicked.
fn guarded<T>(name: &str, what: &str, work: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        let message = (panic.downcast_ref::<&str>().copied())
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("no message");
        Err(Error::InvalidProgram {
            program: name.into(),
            reason: format!(
                "naga panicked {what} ({message}): the module is malformed; check the \
                 compiler that made it (spirv-val tells what is wrong)"
            ),
        })
    })
}

fn reflect(name: &str, module: &naga::Module, entry: &str) -> Result<Reflected> {
    let invalid = |reason: String| Error::InvalidProgram {
        program: name.into(),
        reason,
    };
    let point = module
        .entry_points
        .iter()
        .find(|e| e.name == entry && e.stage == naga::ShaderStage::Compute)
        .ok_or_else(|| {
            let names: Vec<&str> = module
                .entry_points
                .iter()
                .filter(|e| e.stage == naga::ShaderStage::Compute)
                .map(|e| e.name.as_str())
                .collect();
            invalid(format!(
                "it has no compute entry point `{entry}` (it has {names:?}); name one of those"
            ))
        })?;
    let mut bindings = Vec::new();
    let mut push = None;
    for (_, global) in module.global_variables.iter() {
        match global.space {
            naga::AddressSpace::Storage { access } => {
                let Some(binding) = &global.binding else {
                    continue;
                };
                if binding.group != 0 {
                    return Err(invalid(format!(
                        "storage buffer `{}` is in group {}; hwqueue binds its buffers in \
                         @group(0)",
                        global.name.as_deref().unwrap_or("?"),
                        binding.group
                    )));
                }
                bindings.push((binding.binding, access.contains(naga::StorageAccess::STORE)));
            }
            naga::AddressSpace::Immediate => push = Some(global.ty),
            naga::AddressSpace::Uniform | naga::AddressSpace::Handle => {
                return Err(invalid(format!(
                    "`{}` is a uniform buffer, texture or sampler; hwqueue passes only storage \
                     buffers and push-constant scalars",
                    global.name.as_deref().unwrap_or("?")
                )));
            }
            _ => {}
        }
    }
    bindings.sort_unstable();
    if bindings
        .iter()
        .enumerate()
        .any(|(i, &(b, _))| b as usize != i)
    {
        let numbers: Vec<u32> = bindings.iter().map(|(b, _)| *b).collect();
        return Err(invalid(format!(
            "its storage buffers are bindings {numbers:?} of @group(0); number them 0, 1, … in \
             argument order"
        )));
    }
    let mut scalars = Vec::new();
    let mut push_size = 0;
    if let Some(ty) = push {
        let scalar_type = |ty: naga::Handle<naga::Type>| -> Result<ScalarType> {
            use naga::ScalarKind::{Float, Sint, Uint};
            match module.types[ty].inner {
                naga::TypeInner::Scalar(naga::Scalar { kind, width }) => match (kind, width) {
                    (Uint, 4) => Ok(ScalarType::U32),
                    (Sint, 4) => Ok(ScalarType::I32),
                    (Float, 4) => Ok(ScalarType::F32),
                    (Uint, 8) => Ok(ScalarType::U64),
                    (Sint, 8) => Ok(ScalarType::I64),
                    (Float, 8) => Ok(ScalarType::F64),
                    _ => Err(()),
                },
                _ => Err(()),
            }
            .map_err(|()| {
                invalid(
                    "its push constants hold something other than scalars (u32, i32, f32, u64, \
                     i64, f64); pass vectors as buffers"
                        .into(),
                )
            })
        };
        push_size = module.types[ty].inner.size(module.to_ctx());
        // Members in order; a struct member (as a SPIR-V writer wraps the
        // push constants in a block) flattened in place.
        fn flatten(
            module: &naga::Module,
            ty: naga::Handle<naga::Type>,
            at: u32,
            out: &mut Vec<(naga::Handle<naga::Type>, u32)>,
        ) {
            match &module.types[ty].inner {
                naga::TypeInner::Struct { members, .. } => {
                    for member in members {
                        // Saturated: such an offset fails the span check.
                        flatten(module, member.ty, at.saturating_add(member.offset), out);
                    }
                }
                _ => out.push((ty, at)),
            }
        }
        let mut leaves = Vec::new();
        flatten(module, ty, 0, &mut leaves);
        for (leaf, offset) in leaves {
            let kind = scalar_type(leaf)?;
            // The span covers every member, wherever a SPIR-V writer put
            // it (naga's size of the struct follows its last member only).
            push_size = push_size.max(offset.saturating_add(kind.width()));
            scalars.push((kind, offset));
        }
        if push_size > MAX_PUSH_BYTES {
            return Err(invalid(format!(
                "its push constants span {push_size} bytes, more than the {MAX_PUSH_BYTES} a \
                 Vulkan device must take at most (check the members' offsets); pass larger \
                 arguments as buffers"
            )));
        }
    }
    Ok(Reflected {
        buffers: bindings.len(),
        writes: bindings.iter().map(|(_, writes)| *writes).collect(),
        scalars,
        push_size: push_size.next_multiple_of(4),
        workgroup_size: point.workgroup_size,
    })
}

/// SPIR-V of `module`'s compute entry point `entry` (SPIR-V 1.3, Vulkan
/// 1.1's; out-of-bounds reads give 0 and writes are dropped, as WGSL says;
/// no debug info).
fn compile(
    name: &str,
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    entry: &str,
) -> Result<Vec<u32>> {
    let policy = naga::proc::BoundsCheckPolicy::ReadZeroSkipWrite;
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        flags: naga::back::spv::WriterFlags::empty(),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: policy,
            buffer: policy,
            image_load: policy,
            binding_array: policy,
        },
        ..naga::back::spv::Options::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.into(),
    };
    naga::back::spv::write_vec(module, info, &options, Some(&pipeline)).map_err(|error| {
        Error::Compile {
            program: name.into(),
            compiler: "naga (SPIR-V writer)".into(),
            output: error.to_string(),
        }
    })
}
