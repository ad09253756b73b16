"""The single-domain benchmarks torchvision knows, read from their official on-disk formats.

Every dataset is one row of :data:`TABLE`. Folders under ``--data-root`` are the ones
torchvision creates, so ``--download`` (torchvision's downloader) and a manual download land
in the same place; the reading never goes through torchvision. SVHN and USPS get a folder of
their own (torchvision would drop their files straight into the root). CINIC-10 is here too:
it is a CIFAR-10 sibling, read as an image-folder tree.
"""
from __future__ import annotations

from fedcache.extract.datasets import _formats as fmt
from fedcache.extract.datasets._common import (
    DIGITS,
    SEEDED_SPLIT,
    StandardSet,
    read_class_folders,
    readable,
    register,
    torchvision_download as tv,
)

CIFAR10 = "airplane automobile bird cat deer dog frog horse ship truck".split()

CIFAR100 = """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab
crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard
lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse mushroom
oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine
possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake spider
squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor train trout
tulip turtle wardrobe whale willow_tree wolf woman worm""".split()

FASHION = ("t-shirt or top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")

# Label order of imagelabels.mat (1..102); the archive itself carries no names.
FLOWERS = tuple(
    """pink primrose|hard-leaved pocket orchid|canterbury bells|sweet pea|english marigold|tiger lily|
moon orchid|bird of paradise|monkshood|globe thistle|snapdragon|colt's foot|king protea|spear thistle|
yellow iris|globe-flower|purple coneflower|peruvian lily|balloon flower|giant white arum lily|fire lily|
pincushion flower|fritillary|red ginger|grape hyacinth|corn poppy|prince of wales feathers|
stemless gentian|artichoke|sweet william|carnation|garden phlox|love in the mist|mexican aster|
alpine sea holly|ruby-lipped cattleya|cape flower|great masterwort|siam tulip|lenten rose|
barbeton daisy|daffodil|sword lily|poinsettia|bolero deep blue|wallflower|marigold|buttercup|
oxeye daisy|common dandelion|petunia|wild pansy|primula|sunflower|pelargonium|bishop of llandaff|gaura|
geranium|orange dahlia|pink-yellow dahlia|cautleya spicata|japanese anemone|black-eyed susan|
silverbush|californian poppy|osteospermum|spring crocus|bearded iris|windflower|tree poppy|gazania|
azalea|water lily|rose|thorn apple|morning glory|passion flower|lotus|toad lily|anthurium|frangipani|
clematis|hibiscus|columbine|desert-rose|tree mallow|magnolia|cyclamen|watercress|canna lily|
hippeastrum|bee balm|ball moss|foxglove|bougainvillea|camellia|mallow|mexican petunia|bromelia|
blanket flower|trumpet creeper|blackberry lily""".replace("\n", "").split("|")
)

# Class ids 1..37 of the annotation lists (alphabetical, ignoring case).
PETS = """Abyssinian american_bulldog american_pit_bull_terrier basset_hound beagle Bengal Birman Bombay
boxer British_Shorthair chihuahua Egyptian_Mau english_cocker_spaniel english_setter german_shorthaired
great_pyrenees havanese japanese_chin keeshond leonberger Maine_Coon miniature_pinscher newfoundland
Persian pomeranian pug Ragdoll Russian_Blue saint_bernard samoyed scottish_terrier shiba_inu Siamese
Sphynx staffordshire_bull_terrier wheaten_terrier yorkshire_terrier""".split()

DTD = """banded blotchy braided bubbly bumpy chequered cobwebbed cracked crosshatched crystalline dotted
fibrous flecked freckled frilly gauzy grid grooved honeycombed interlaced knitted lacelike lined marbled
matted meshed paisley perforated pitted pleated polka-dotted porous potholed scaly smeared spiralled
sprinkled stained stratified striped studded swirly veined waffled woven wrinkled zigzagged""".split()

EUROSAT = {
    "AnnualCrop": "annual crop field",
    "Forest": "forest",
    "HerbaceousVegetation": "herbaceous vegetation",
    "Highway": "highway",
    "Industrial": "industrial area",
    "Pasture": "pasture",
    "PermanentCrop": "permanent crop plantation",
    "Residential": "residential area",
    "River": "river",
    "SeaLake": "sea or lake",
}

# Folder names sorted as torchvision sorts them (capitals first), so labels agree with it.
CALTECH101 = """Faces Faces_easy Leopards Motorbikes accordion airplanes anchor ant barrel bass beaver
binocular bonsai brain brontosaurus buddha butterfly camera cannon car_side ceiling_fan cellphone
chair chandelier cougar_body cougar_face crab crayfish crocodile crocodile_head cup dalmatian
dollar_bill dolphin dragonfly electric_guitar elephant emu euphonium ewer ferry flamingo flamingo_head
garfield gerenuk gramophone grand_piano hawksbill headphone hedgehog helicopter ibis inline_skate
joshua_tree kangaroo ketch lamp laptop llama lobster lotus mandolin mayfly menorah metronome minaret
nautilus octopus okapi pagoda panda pigeon pizza platypus pyramid revolver rhino rooster saxophone
schooner scissors scorpion sea_horse snoopy soccer_ball stapler starfish stegosaurus stop_sign
strawberry sunflower tick trilobite umbrella watch water_lilly wheelchair wild_cat windsor_chair
wrench yin_yang""".split()
CALTECH101_NAMES = {
    "Faces": "face",
    "Faces_easy": "centered face",
    "Leopards": "leopard",
    "Motorbikes": "motorbike",
    "airplanes": "airplane",
    "binocular": "binoculars",
    "car_side": "side of a car",
    "headphone": "headphones",
    "water_lilly": "water lily",
}

_TRAIN_TEST = ({"train": True}, {"train": False})

TABLE = (
    StandardSet(
        name="cifar10",
        description="CIFAR-10: 60k 32x32 colour images, 10 classes",
        reader=fmt.read_cifar,
        dirs=("cifar-10-batches-py",),
        classes=tuple(CIFAR10),
        params={
            "files": {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
            "label_key": b"labels",
        },
        download=tv("CIFAR10", *_TRAIN_TEST),
        how_to_get="download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and extract it in "
        "--data-root, giving <data-root>/cifar-10-batches-py/{data_batch_1..5,test_batch}.",
    ),
    StandardSet(
        name="cifar100",
        description="CIFAR-100: 60k 32x32 colour images, 100 fine classes",
        reader=fmt.read_cifar,
        dirs=("cifar-100-python",),
        classes=readable(CIFAR100),
        params={"files": {"train": ["train"], "test": ["test"]}, "label_key": b"fine_labels"},
        download=tv("CIFAR100", *_TRAIN_TEST),
        how_to_get="download https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz and extract it in "
        "--data-root, giving <data-root>/cifar-100-python/{train,test}.",
    ),
    StandardSet(
        name="mnist",
        description="MNIST: 70k 28x28 handwritten digits",
        reader=fmt.read_idx,
        dirs=("MNIST/raw",),
        classes=DIGITS,
        params={"prefixes": {"train": "train", "test": "t10k"}},
        download=tv("MNIST", *_TRAIN_TEST),
        how_to_get="put the four idx files of http://yann.lecun.com/exdb/mnist/ "
        "({train,t10k}-{images-idx3,labels-idx1}-ubyte, gzipped or not) in <data-root>/MNIST/raw/.",
    ),
    StandardSet(
        name="fashion-mnist",
        description="Fashion-MNIST: 70k 28x28 greyscale clothing images, 10 classes",
        reader=fmt.read_idx,
        dirs=("FashionMNIST/raw",),
        classes=FASHION,
        params={"prefixes": {"train": "train", "test": "t10k"}},
        download=tv("FashionMNIST", *_TRAIN_TEST),
        how_to_get="put the four idx files of https://github.com/zalandoresearch/fashion-mnist "
        "({train,t10k}-{images-idx3,labels-idx1}-ubyte, gzipped or not) in <data-root>/FashionMNIST/raw/.",
    ),
    StandardSet(
        name="svhn",
        description="SVHN: 99k 32x32 cropped house-number digits (train + test, no extra)",
        reader=fmt.read_digits_mat,
        dirs=("svhn",),
        classes=DIGITS,
        params={"files": {"train": "train_32x32.mat", "test": "test_32x32.mat"}},
        download=tv("SVHN", {"split": "train"}, {"split": "test"}, subdir="svhn"),
        how_to_get="download train_32x32.mat and test_32x32.mat from http://ufldl.stanford.edu/housenumbers/ "
        "into <data-root>/svhn/.",
    ),
    StandardSet(
        name="usps",
        description="USPS: 9.3k 16x16 greyscale handwritten digits",
        reader=fmt.read_usps,
        dirs=("usps",),
        classes=DIGITS,
        params={"files": {"train": "usps.bz2", "test": "usps.t.bz2"}},
        download=tv("USPS", *_TRAIN_TEST, subdir="usps"),
        how_to_get="download usps.bz2 and usps.t.bz2 from "
        "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html#usps into <data-root>/usps/.",
    ),
    StandardSet(
        name="flowers102",
        description="Oxford Flowers-102: 8.2k flower photos, 102 classes (train = train + val)",
        reader=fmt.read_flowers,
        dirs=("flowers-102",),
        classes=FLOWERS,
        params={"splits": {"train": ("trnid", "valid"), "test": ("tstid",)}},
        download=tv("Flowers102"),
        how_to_get="from https://www.robots.ox.ac.uk/~vgg/data/flowers/102/ extract 102flowers.tgz (giving jpg/) "
        "and put imagelabels.mat and setid.mat beside it, in <data-root>/flowers-102/.",
    ),
    StandardSet(
        name="oxford-pets",
        description="Oxford-IIIT Pet: 7.4k photos of 37 cat and dog breeds",
        reader=fmt.read_pets,
        dirs=("oxford-iiit-pet",),
        classes=readable([k.lower() for k in PETS], {"german_shorthaired": "german shorthaired pointer"}),
        params={"lists": {"train": "trainval", "test": "test"}},
        download=tv("OxfordIIITPet", {"split": "trainval"}, {"split": "test"}),
        how_to_get="from https://www.robots.ox.ac.uk/~vgg/data/pets/ extract images.tar.gz and "
        "annotations.tar.gz in <data-root>/oxford-iiit-pet/ (giving images/ and annotations/).",
    ),
    StandardSet(
        name="dtd",
        description="Describable Textures: 5.6k texture photos, 47 classes (split 1, train = train + val)",
        reader=fmt.read_dtd,
        dirs=("dtd/dtd", "dtd"),
        keys=tuple(DTD),
        classes=tuple(DTD),
        params={"lists": {"train": ("train1", "val1"), "test": ("test1",)}},
        download=tv("DTD"),
        how_to_get="extract dtd-r1.0.1.tar.gz from https://www.robots.ox.ac.uk/~vgg/data/dtd/ in --data-root, "
        "giving <data-root>/dtd/images/ and <data-root>/dtd/labels/.",
    ),
    StandardSet(
        name="eurosat",
        description="EuroSAT RGB: 27k 64x64 Sentinel-2 patches, 10 land-use classes (seeded split)",
        reader=read_class_folders,
        dirs=("eurosat/2750", "2750", "EuroSAT_RGB"),
        keys=tuple(EUROSAT),
        classes=tuple(EUROSAT.values()),
        download=tv("EuroSAT"),
        reads=SEEDED_SPLIT,
        how_to_get="extract the RGB EuroSAT.zip from https://github.com/phelber/EuroSAT so that "
        "<data-root>/eurosat/2750/<class>/*.jpg exists.",
    ),
    StandardSet(
        name="stanford-cars",
        description="Stanford Cars: 16k car photos, 196 make/model/year classes (names from the devkit)",
        reader=fmt.read_cars,
        dirs=("stanford_cars",),
        how_to_get="torchvision can no longer download it. From https://ai.stanford.edu/~jkrause/cars/car_dataset.html "
        "(or a mirror) put cars_train/, cars_test/, cars_test_annos_withlabels.mat and the devkit "
        "(devkit/cars_meta.mat, devkit/cars_train_annos.mat) in <data-root>/stanford_cars/.",
    ),
    StandardSet(
        name="caltech101",
        description="Caltech-101: 8.7k object photos, 101 classes, no background class (seeded split)",
        reader=read_class_folders,
        dirs=("caltech101/101_ObjectCategories", "101_ObjectCategories", "caltech-101/101_ObjectCategories"),
        keys=tuple(CALTECH101),
        classes=readable(CALTECH101, CALTECH101_NAMES),
        params={"ignore": ("BACKGROUND_Google",)},
        download=tv("Caltech101"),
        reads=SEEDED_SPLIT,
        how_to_get="extract caltech-101.zip from https://data.caltech.edu/records/mzrjq-6wc02 (and the "
        "101_ObjectCategories.tar.gz inside it) so that <data-root>/caltech101/101_ObjectCategories/<class>/ exists.",
    ),
    StandardSet(
        name="cinic10",
        description="CINIC-10: 270k 32x32 images (CIFAR-10 + downsampled ImageNet), train = train + valid",
        reader=read_class_folders,
        dirs=("cinic-10", "CINIC-10", "cinic10"),
        keys=tuple(CIFAR10),
        classes=tuple(CIFAR10),
        source="folder",
        params={"split_dirs": {"train": ("train", "valid"), "test": ("test",)}},
        how_to_get="extract CINIC-10.tar.gz from https://datashare.ed.ac.uk/handle/10283/3192 into "
        "<data-root>/cinic-10/, giving train/, valid/ and test/ with one folder per class.",
    ),
)

for _row in TABLE:
    register(_row)
