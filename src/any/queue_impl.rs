//! The `HardwareQueue` impl of a [`backend_set!`](crate::backend_set)'s
//! queue enum, the largest part of the expansion, as a macro of its own:
//! native commands go to the variant on a `match`, a cross-backend wait goes
//! through `wait_foreign`, and anything else of another backend rejects the
//! batch. Called only by `backend_set!`.

/// `backend_set!`'s queue impl (not part of the API).
#[doc(hidden)]
#[macro_export]
macro_rules! __backend_set_queue {
    ($Set:ident, $Queue:ident, $Signal:ident, $Buffer:ident, $Program:ident; $( $(#[$meta:meta])* $V:ident($as_v:ident): $B:ty ),+) => {
        impl $crate::HardwareQueue for $Queue {
            type Backend = $Set;

            #[inline]
            fn kind(&self) -> $crate::QueueKind {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::kind(q), )+ }
            }

            #[inline]
            fn wait(&mut self, signal: &$Signal, value: u64) -> &mut Self {
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        #[allow(irrefutable_let_patterns)]
                        if let $Signal::$V(s) = signal {
                            $crate::HardwareQueue::wait(q, s, value);
                        } else {
                            $crate::HardwareQueue::wait_foreign(q, signal, value);
                        }
                    } )+
                }
                self
            }

            #[inline]
            fn wait_settled(&mut self, signal: &$Signal, value: u64) -> &mut Self {
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        #[allow(irrefutable_let_patterns)]
                        if let $Signal::$V(s) = signal {
                            $crate::HardwareQueue::wait_settled(q, s, value);
                        } else {
                            $crate::HardwareQueue::wait_foreign_settled(q, signal, value);
                        }
                    } )+
                }
                self
            }

            #[inline]
            fn set_failure_scope(&mut self, scope: $crate::FailureScope) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::set_failure_scope(q, scope), )+ }
            }

            #[inline]
            fn signal(&mut self, signal: &$Signal, value: u64) -> &mut Self {
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        #[allow(irrefutable_let_patterns)]
                        if let $Signal::$V(s) = signal {
                            $crate::HardwareQueue::signal(q, s, value);
                        } else {
                            $crate::any::reject_signal(q, signal.backend_id(), "signal", value,
                                "signal one of the queue's own backend and let the other queue wait on it");
                        }
                    } )+
                }
                self
            }

            #[inline]
            fn exec(
                &mut self,
                program: &$Program,
                buffers: &[&$Buffer],
                scalars: &[$crate::Scalar],
                params: $crate::ExecParams,
            ) -> &mut Self {
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        match program.$as_v() {
                            None => {
                                $crate::HardwareQueue::reject(q, $crate::any::mismatch(
                                    <$B as $crate::Backend>::ID,
                                    program.backend_id(),
                                    ::std::format!("the program `{}` of exec", $crate::Program::name(program)),
                                ));
                            }
                            Some(p) => {
                                let outcome = $crate::any::with_gathered(
                                    buffers.len(),
                                    |index| buffers[index].$as_v(),
                                    |inner| { $crate::HardwareQueue::exec(q, p, inner, scalars, params); },
                                );
                                if let Err(index) = outcome {
                                    $crate::HardwareQueue::reject(q, $crate::any::mismatch(
                                        <$B as $crate::Backend>::ID,
                                        buffers[index].backend_id(),
                                        ::std::format!("buffer {index} of exec `{}`", $crate::Program::name(program)),
                                    ));
                                }
                            }
                        }
                    } )+
                }
                self
            }

            fn exec_views(
                &mut self,
                program: &$Program,
                buffers: &[&$crate::View<$Set>],
                scalars: &[$crate::Scalar],
                params: $crate::ExecParams,
            ) -> &mut Self {
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        let outcome = match program.$as_v() {
                            None => Err($crate::any::mismatch(
                                <$B as $crate::Backend>::ID,
                                program.backend_id(),
                                ::std::format!("the program `{}` of exec", $crate::Program::name(program)),
                            )),
                            Some(p) => $crate::any::with_views::<$B, _>(
                                buffers.len(),
                                |index| {
                                    let view = buffers[index];
                                    $crate::any::inner_view::<$B>(
                                        view.buffer().$as_v(),
                                        (view.offset(), view.len()),
                                        view.buffer().backend_id(),
                                        || ::std::format!("buffer {index} of exec `{}`", $crate::Program::name(program)),
                                    )
                                },
                                |refs| { $crate::HardwareQueue::exec_views(q, p, refs, scalars, params); },
                            ),
                        };
                        if let Err(error) = outcome {
                            $crate::HardwareQueue::reject(q, error);
                        }
                    } )+
                }
                self
            }

            fn copy<D: $crate::AsView<$Set>, S: $crate::AsView<$Set>>(&mut self, dst: &D, src: &S) -> &mut Self {
                let (dst, src) = ($crate::AsView::view_parts(dst), $crate::AsView::view_parts(src));
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        let views = $crate::any::inner_view::<$B>(
                            dst.0.$as_v(), (dst.1, dst.2), dst.0.backend_id(), || "the copy destination".into(),
                        )
                        .and_then(|d| Ok((d, $crate::any::inner_view::<$B>(
                            src.0.$as_v(), (src.1, src.2), src.0.backend_id(), || "the copy source".into(),
                        )?)));
                        match views {
                            Ok((d, s)) => { $crate::HardwareQueue::copy(q, &d, &s); }
                            Err(error) => { $crate::HardwareQueue::reject(q, error); }
                        }
                    } )+
                }
                self
            }

            fn fill<D: $crate::AsView<$Set>, T: $crate::Pod>(&mut self, dst: &D, pattern: T) -> &mut Self {
                let dst = $crate::AsView::view_parts(dst);
                match self {
                    $( $(#[$meta])* Self::$V(q) => $crate::any::record_on_view(
                        q,
                        $crate::any::inner_view::<$B>(
                            dst.0.$as_v(), (dst.1, dst.2), dst.0.backend_id(), || "the fill destination".into(),
                        ),
                        |q, d| { $crate::HardwareQueue::fill(q, d, pattern); },
                    ), )+
                }
                self
            }

            fn upload<D: $crate::AsView<$Set>, T: $crate::Pod>(&mut self, dst: &D, data: &[T]) -> &mut Self {
                let dst = $crate::AsView::view_parts(dst);
                match self {
                    $( $(#[$meta])* Self::$V(q) => $crate::any::record_on_view(
                        q,
                        $crate::any::inner_view::<$B>(
                            dst.0.$as_v(), (dst.1, dst.2), dst.0.backend_id(), || "the upload destination".into(),
                        ),
                        |q, d| { $crate::HardwareQueue::upload(q, d, data); },
                    ), )+
                }
                self
            }

            fn upload_vec<D, T, O>(&mut self, dst: &D, data: O) -> &mut Self
            where
                D: $crate::AsView<$Set>,
                T: $crate::Pod,
                O: ::std::convert::AsRef<[T]> + Send + Sync + 'static,
            {
                let dst = $crate::AsView::view_parts(dst);
                match self {
                    $( $(#[$meta])* Self::$V(q) => $crate::any::record_on_view(
                        q,
                        $crate::any::inner_view::<$B>(
                            dst.0.$as_v(), (dst.1, dst.2), dst.0.backend_id(), || "the upload destination".into(),
                        ),
                        |q, d| { $crate::HardwareQueue::upload_vec(q, d, data); },
                    ), )+
                }
                self
            }

            fn download<S: $crate::AsView<$Set>, T: $crate::Pod + Send>(
                &mut self,
                src: &S,
                into: &$crate::Download<T>,
            ) -> &mut Self {
                let src = $crate::AsView::view_parts(src);
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        match $crate::any::inner_view::<$B>(
                            src.0.$as_v(), (src.1, src.2), src.0.backend_id(), || "the download source".into(),
                        ) {
                            Ok(s) => { $crate::HardwareQueue::download(q, &s, into); }
                            Err(error) => {
                                // The download fails with the reason, so
                                // whoever waits on it learns why.
                                $crate::any::fail_download(into, &error);
                                $crate::HardwareQueue::reject(q, error);
                            }
                        }
                    } )+
                }
                self
            }

            fn collective(
                &mut self,
                communicator: &$crate::collective::Communicator,
                op: $crate::collective::CollectiveOp,
                element: $crate::collective::Element,
                send: ::std::option::Option<&$crate::View<$Set>>,
                recv: ::std::option::Option<&$crate::View<$Set>>,
            ) -> &mut Self {
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        // Each view as the variant's own, or the mismatch.
                        let inner = |view: ::std::option::Option<&$crate::View<$Set>>, what: &'static str| {
                            view.map(|view| $crate::any::inner_view::<$B>(
                                view.buffer().$as_v(),
                                (view.offset(), view.len()),
                                view.buffer().backend_id(),
                                || what.into(),
                            ))
                            .transpose()
                        };
                        let views = inner(send, "the collective's send view")
                            .and_then(|s| Ok((s, inner(recv, "the collective's receive view")?)));
                        match views {
                            Ok((s, r)) => {
                                $crate::HardwareQueue::collective(q, communicator, op, element, s.as_ref(), r.as_ref());
                            }
                            Err(error) => {
                                let count = $crate::collective::count_of(
                                    op,
                                    element,
                                    send.map(|v| v.len()),
                                    recv.map(|v| v.len()),
                                );
                                $crate::HardwareQueue::forfeit_collective(q, communicator, (op, element, count), error);
                            }
                        }
                    } )+
                }
                self
            }

            fn check_collective(
                &self,
                communicator: &$crate::collective::Communicator,
            ) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::check_collective(q, communicator), )+ }
            }

            fn forfeit_collective(
                &mut self,
                communicator: &$crate::collective::Communicator,
                what: ($crate::collective::CollectiveOp, $crate::collective::Element, usize),
                cause: $crate::Error,
            ) -> &mut Self {
                match self { $( $(#[$meta])* Self::$V(q) => {
                    $crate::HardwareQueue::forfeit_collective(q, communicator, what, cause);
                } )+ }
                self
            }

            #[inline]
            fn memory_barrier(&mut self) -> &mut Self {
                // Tested in the variants' order (a `match` of three arms
                // was lowered testing the first variant last).
                $( $(#[$meta])* {
                    #[allow(irrefutable_let_patterns)]
                    if let Self::$V(q) = self {
                        $crate::HardwareQueue::memory_barrier(q);
                        return self;
                    }
                } )+
                #[allow(unreachable_code)]
                {
                    unreachable!("every variant is tested above")
                }
            }

            fn alloca(&mut self, size: usize) -> $crate::Result<$Buffer> {
                match self {
                    $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::alloca(q, size).map($Buffer::$V), )+
                }
            }

            fn dealloca(&mut self, buffer: &$Buffer) -> &mut Self {
                match self {
                    $( $(#[$meta])* Self::$V(q) => {
                        match buffer.$as_v() {
                            Some(b) => { $crate::HardwareQueue::dealloca(q, b); }
                            None => {
                                $crate::HardwareQueue::reject(q, $crate::any::mismatch(
                                    <$B as $crate::Backend>::ID,
                                    buffer.backend_id(),
                                    "the buffer of `dealloca`".into(),
                                ));
                            }
                        }
                    } )+
                }
                self
            }

            #[inline]
            fn wait_foreign<S: $crate::TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self {
                match self { $( $(#[$meta])* Self::$V(q) => { $crate::HardwareQueue::wait_foreign(q, signal, value); } )+ }
                self
            }

            #[inline]
            fn wait_foreign_settled<S: $crate::TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self {
                match self { $( $(#[$meta])* Self::$V(q) => { $crate::HardwareQueue::wait_foreign_settled(q, signal, value); } )+ }
                self
            }

            #[inline]
            fn reject(&mut self, error: $crate::Error) -> &mut Self {
                match self { $( $(#[$meta])* Self::$V(q) => { $crate::HardwareQueue::reject(q, error); } )+ }
                self
            }

            #[inline]
            fn recorded(&self) -> usize {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::recorded(q), )+ }
            }

            #[inline]
            fn rejection(&self) -> ::std::option::Option<&$crate::Error> {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::rejection(q), )+ }
            }

            #[inline]
            fn replay_as(&mut self, key: u32) -> &mut Self {
                match self { $( $(#[$meta])* Self::$V(q) => { $crate::HardwareQueue::replay_as(q, key); } )+ }
                self
            }

            #[inline]
            fn launches(&self) -> $crate::Launches {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::launches(q), )+ }
            }

            #[inline]
            fn replay_recorded(&mut self, key: u32, kernels: &[u32]) -> bool {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::replay_recorded(q, key, kernels), )+ }
            }

            #[inline]
            fn replay_program(&mut self, index: u32) -> &mut Self {
                match self { $( $(#[$meta])* Self::$V(q) => { $crate::HardwareQueue::replay_program(q, index); } )+ }
                self
            }

            #[inline]
            fn discard(&mut self) {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::discard(q), )+ }
            }

            #[inline]
            fn submit(&mut self) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::submit(q), )+ }
            }

            #[inline]
            fn synchronize(&mut self) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::synchronize(q), )+ }
            }

            fn set_profiling(&mut self, on: bool) {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::set_profiling(q, on), )+ }
            }

            fn profiling(&self) -> bool {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::profiling(q), )+ }
            }

            fn take_profile(&mut self) -> ::std::vec::Vec<$crate::ProfileEvent> {
                match self { $( $(#[$meta])* Self::$V(q) => $crate::HardwareQueue::take_profile(q), )+ }
            }
        }
    }
}
